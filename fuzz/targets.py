"""Fuzz targets: what a client, a config author or a pod sends, through our code. Each takes the fuzzer's bytes and
raises only on a defect: an exception that is not the clear error that input deserves, or state left wrong.

- `request`: a request body on one of the API paths through the parser and the request assembly (with a model
  rewrite, so bodies are re-encoded): a routable request or a `RequestError` (a 4xx in the API's shape).
- `config`: a config file through the loader and the plugin builder: a pipeline or a `ConfigError` (file:line).
- `kv_events`: a KV-event payload through the decoder and the applier: applied or counted, never raised, and a real
  pod's store still matches all its blocks afterwards.
"""

from __future__ import annotations

from collections.abc import Callable

from epp.config import ConfigError, parse_config
from epp.datalayer.datastore import Datastore
from epp.framework.errors import RequestError
from epp.framework.parsing import request_path
from epp.kvcache.events import BlockStored, DecodeError, EventBatch, decode_batch
from epp.kvcache.index import MemoryIndex
from epp.kvcache.ingest import EventApplier, slice_batch
from epp.kvcache.tokens import BlockSizes, TokenProcessor
from epp.kvcache.validation import Budgets, EventGuard
from epp.protocol.openai import build_request
from epp.wiring import build_pipeline, plugin_context
from epp.wiring.builtins import default_parsers

PATHS = (
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/responses",
    "/v1/embeddings",
    "/v1/messages",
    "/v1/conversations",
    "/v1/images/generations",
    "/generate",
    "/inference/v1/generate",
    "/v1/unknown",
)
_PARSERS = default_parsers()
_REWRITES = {"m": "rewritten", "alias": "m"}


def request(data: bytes) -> None:
    """First byte: the path; the rest: the body."""
    if not data:
        return
    path = PATHS[data[0] % len(PATHS)]
    headers = {":path": path, ":method": "POST", "content-type": "application/json"}
    body = data[1:]
    try:
        parsed = _PARSERS.resolve(request_path(headers)).parse(headers, body)
        build_request(headers, parsed, body, _REWRITES)
    except RequestError as e:
        assert 400 <= e.status < 500, (e.status, e.message)
        e.body("anthropic" if path == "/v1/messages" else "openai")


def config(data: bytes) -> None:
    text = data.decode("utf-8", "replace")
    try:
        cfg = parse_config(text, source="fuzz.yaml")
        build_pipeline(cfg, plugin_context(Datastore()))
    except ConfigError as e:
        assert str(e).startswith(("fuzz.yaml", "<default config>")), str(e)


_REAL = "10.0.0.1:8000"
_REAL_TOKENS = list(range(1000, 1000 + 16 * 4))


class _KV:
    def __init__(self) -> None:
        self.index = MemoryIndex()
        self.tokens = TokenProcessor(16)
        budgets = Budgets(blocks_per_second=1e12, burst_blocks=1 << 40)
        self.applier = EventApplier(self.index, self.tokens, BlockSizes(default=16), EventGuard(budgets))
        self.real = EventBatch(0.0, [BlockStored([1, 2, 3, 4], None, _REAL_TOKENS, 16, medium="GPU")])
        self.keys = self.tokens.block_keys(_REAL_TOKENS, "m")


_kv: _KV | None = None


def kv_events(data: bytes) -> None:
    """First byte: the model (one of four); the rest: the payload, applied as pod `fuzz`."""
    global _kv
    if _kv is None:
        _kv = _KV()
    kv = _kv
    if not data:
        return
    model = ("m", "other", "m@x", "")[data[0] % 4]
    try:
        batch = decode_batch(data[1:])
    except DecodeError:
        return
    for part in slice_batch(batch):
        kv.applier.apply("fuzz", model, part)
    kv.applier.apply(_REAL, "m", kv.real)
    got = kv.index.lookup_now(kv.keys)
    assert got[_REAL].blocks == 4, got
    assert kv.index.request_key(_REAL, 4) is not None
    kv.applier.clear_pod("fuzz")
    kv.index.maintain()


TARGETS: dict[str, Callable[[bytes], None]] = {"request": request, "config": config, "kv_events": kv_events}
