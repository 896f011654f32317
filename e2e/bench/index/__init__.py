"""The KV-cache index: event ingest, lookup, memory, pauses, Redis, one huge batch."""
