"""Discovery plugin types (llm-d-router's `dataLayer.discovery`)."""
