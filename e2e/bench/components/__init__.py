"""One component at a time, in process: scheduling cycle, scraper, latency model, multimodal tokenization, discovery."""
