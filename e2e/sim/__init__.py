"""A vLLM-compatible model-server simulator (OpenAI API, metrics, KV events, latency model) for tests and demos.

Modules: `config` (flags), `tokenizer` (Qwen2.5, vLLM's rendering), `hashing` (vLLM's sha256_cbor block
hashes), `kvcache` (blocks, prefix reuse, LRU eviction → events), `events` (wire encodings), `publisher`
(ZMQ PUB + ROUTER replay), `engine` (admission, latency model), `metrics` (vLLM names), `server` (aiohttp
routes), `launch` (subprocess / in-thread launchers), `fixtures` (pytest), `testing` (SUB/replay clients and
decoders built on vLLM's structs).

HTTP: POST /v1/completions, /v1/chat/completions (SSE with `stream_options.include_usage`),
/v1/completions/render, /v1/chat/completions/render, /tokenize, /detokenize, /reset_prefix_cache;
GET /v1/models, /health, /health/ready, /metrics. Admin (failure injection): GET /admin/state;
POST /admin/config {latency/failure fields}, /admin/events {"mode": on|off|lossy, "restart": true, "rank": r},
/admin/unready {"seconds": s}, /admin/crash. Requests may pin a data-parallel engine with `X-data-parallel-rank`.
"""
