"""A vLLM-compatible model-server simulator (OpenAI API, metrics, KV events, latency model) for tests and demos."""
