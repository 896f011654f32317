"""What the EPP costs per request: added latency, picks/s, the in-process path, the Python floor beside it."""
