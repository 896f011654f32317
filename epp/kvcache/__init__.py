"""Precise prefix-cache state: which pod holds which KV blocks, from the events engines publish.

Knows nothing of gRPC or Envoy. The pieces: `tokens` (request-key chain hash), `events` (wire decoders),
`index`/`redis_index` (block → pods), `ingest` (events → index), `sequencing` (gaps, restarts), and the event
pool: `subscriptions` (ZMQ SUB sockets following the Datastore) → `workers` (sharded queues applying each pod's
batches in order) ↔ `replay` (fetching missed batches from a publisher's ROUTER), assembled by `pool.EventPool`
with its settings in `config.PoolConfig`; `service` puts index, tokens and pool together for the plugins.
"""
