"""The server's shutdown closes the HTTP sessions the tokenizers opened (no "Unclosed client session" at exit)."""

from __future__ import annotations

import gc
import warnings
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from e2e.harness.aioserve import serve_app
from epp.config import parse_config
from epp.framework import TOKENIZED_PROMPT, ApiKind, InferenceRequest
from epp.plugins.producers.token_producer import TokenProducer
from epp.server.metrics import RequestMetrics
from epp.server.runner import EppServer, ServeOptions
from epp.tokenization.prompt import PromptTokenizer
from epp.wiring import build_runtime


@pytest.fixture
async def model_server() -> AsyncIterator[str]:
    """A stand-in for the model server's /tokenize and a media URL."""

    async def tokenize(request: web.Request) -> web.Response:
        return web.json_response({"tokens": [1, 2, 3]})

    async def image(request: web.Request) -> web.Response:
        return web.Response(body=b"\x89PNG not really")

    app = web.Application()
    app.router.add_post("/tokenize", tokenize)
    app.router.add_get("/cat.png", image)
    async with serve_app(app) as port:
        yield f"http://127.0.0.1:{port}"


async def test_stop_closes_the_tokenizer_sessions(model_server: str) -> None:
    config = parse_config(
        f"plugins:\n- type: token-producer\n  parameters: {{tokenizer: {{type: tokenize, url: '{model_server}'}}}}\n"
        "- type: queue-scorer\n"
    )
    runtime = build_runtime(config)
    assert runtime.pipeline is not None
    producer = runtime.pipeline.plugins["token-producer"]
    assert isinstance(producer, TokenProducer) and isinstance(producer.tokenizer, PromptTokenizer)
    tok = producer.tokenizer
    req = InferenceRequest("r", "/v1/completions", ApiKind.COMPLETIONS, "m", "m", {"prompt": "hi"}, prompt="hi")
    await producer.prepare(req, [])
    assert req.data.require(TOKENIZED_PROMPT).token_ids == [1, 2, 3]  # the backend's session is open
    assert await tok._media_bytes(model_server + "/cat.png")  # and the media session
    sessions = [tok.backend._session, tok._session]  # type: ignore[attr-defined]
    assert all(s is not None and not s.closed for s in sessions)
    registry = CollectorRegistry()
    opts = ServeOptions(bind_address="127.0.0.1", grpc_port=0, grpc_health_port=0, metrics_port=0, drain_timeout=0)
    server = EppServer(runtime, opts, registry=registry, metrics=RequestMetrics(registry))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        await server.start()
        await server.stop()  # right after start: a task of the server's may not have run yet
        assert all(s.closed for s in sessions)
        del sessions, tok, producer, runtime, server
        gc.collect()
    assert not [w for w in caught if "Unclosed" in str(w.message) or "never awaited" in str(w.message)]


async def test_a_failing_closer_does_not_stop_the_others() -> None:
    runtime = build_runtime(parse_config("plugins: [{type: queue-scorer}]\n"))
    closed: list[str] = []

    async def bad() -> None:
        raise RuntimeError("boom")

    async def good() -> None:
        closed.append("good")

    runtime.closers = [bad, good]
    await runtime.close()
    assert closed == ["good"]
