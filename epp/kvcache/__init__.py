"""Precise prefix-cache state: which pod holds which KV blocks, from the events engines publish.

Knows nothing of gRPC or Envoy. The pieces: `tokens` (request-key chain hash), `events` (wire decoders),
`index`/`redis_index` (block → pods), `ingest` (events → index), `sequencing` (gaps, restarts, replay),
`pool` (ZMQ subscribers and sharded workers).
"""
