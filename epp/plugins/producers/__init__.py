"""Data producers: request data computed before scheduling (tokens, prefix matches)."""
