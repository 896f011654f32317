"""Tokenization as vLLM does it: chat template + no added specials, completions with specials; cache; /tokenize."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp import web

from e2e.harness.aioserve import serve_app
from epp.tokenization.prompt import HFBackend, HTTPBackend, PromptTokenizer, TokenizationError
from epp.tokenization.qwen import QWEN25_MODEL, load_qwen25_tokenizer, qwen25_tokenizer_dir


@pytest.fixture(scope="module")
def hf() -> Any:
    return load_qwen25_tokenizer()


async def test_chat_matches_vllm_rendering(hf: Any) -> None:
    tok = PromptTokenizer(HFBackend({QWEN25_MODEL: qwen25_tokenizer_dir()}, offload_chars=10))
    msgs = [{"role": "user", "content": [{"type": "text", "text": "hello"}, {"type": "text", "text": "world"}]}]
    got = await tok.tokenize(QWEN25_MODEL, messages=msgs)
    text = hf.apply_chat_template(
        [{"role": "user", "content": "hello\nworld"}], tokenize=False, add_generation_prompt=True
    )
    assert got == hf(text, add_special_tokens=False)["input_ids"]
    assert got[-3:] == hf("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    assert await tok.tokenize(QWEN25_MODEL, messages=msgs) == got and tok.hits == 1


async def test_completion_prompt_ids_and_errors() -> None:
    tok = PromptTokenizer(HFBackend({QWEN25_MODEL: qwen25_tokenizer_dir()}), cache_size=2)
    ids = await tok.tokenize(QWEN25_MODEL, prompt="The quick brown fox")
    assert ids and await tok.tokenize(QWEN25_MODEL, prompt=[1, 2, 3]) == [1, 2, 3]
    big = "word " * 5000  # tokenized on the worker thread, concurrently with small ones
    res = await asyncio.gather(*(tok.tokenize(QWEN25_MODEL, prompt=big + str(i)) for i in range(3)),
                               tok.tokenize(QWEN25_MODEL, prompt="small"))  # fmt: skip
    assert all(len(r) > 4000 for r in res[:3])
    assert len(tok._cache) == 2  # bounded
    with pytest.raises(TokenizationError):
        await tok.tokenize("no-such-model", prompt="x")
    with pytest.raises(TokenizationError):
        await tok.tokenize(QWEN25_MODEL, messages=[{"content": "no role"}])
    with pytest.raises(TokenizationError):
        await tok.tokenize(QWEN25_MODEL, prompt=["a", "b"])


async def test_http_tokenize_endpoint() -> None:
    seen: list[dict[str, Any]] = []

    async def handle(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append(body)
        if body.get("model") == "bad":
            return web.json_response({"error": "nope"}, status=404)
        return web.json_response({"count": 3, "max_model_len": 100, "tokens": [7, 8, 9]})

    app = web.Application()
    app.router.add_post("/tokenize", handle)
    async with serve_app(app) as port:
        backend = HTTPBackend(f"http://127.0.0.1:{port}")
        try:
            tok = PromptTokenizer(backend)
            assert await tok.tokenize("m", messages=[{"role": "user", "content": "hi"}]) == [7, 8, 9]
            assert seen[0]["add_generation_prompt"] is True and seen[0]["messages"][0]["content"] == "hi"
            assert await tok.tokenize("m", prompt="hi") == [7, 8, 9]
            with pytest.raises(TokenizationError, match="HTTP 404"):
                await tok.tokenize("bad", prompt="x")
        finally:
            await backend.close()


async def test_warm_preloads_tokenizer_before_first_request(tmp_path: Any) -> None:
    import shutil

    d = tmp_path / "tok"
    shutil.copytree(qwen25_tokenizer_dir(), d)  # a directory no other test has loaded in this process
    backend = HFBackend({QWEN25_MODEL: d})
    assert str(d) not in HFBackend._loaded
    await PromptTokenizer(backend).warm()
    assert str(d) in HFBackend._loaded
    assert await backend.completion(QWEN25_MODEL, "Hello world") == [9707, 1879]


async def test_precise_plugin_schedules_the_preload() -> None:
    from epp.config import parse_config
    from epp.datalayer.datastore import Datastore
    from epp.wiring import build_pipeline, plugin_context

    # The precise producer asks for a token-producer; the tokenizer it builds is preloaded at startup (a warm-up the
    # server waits for before it reports ready).
    ctx = plugin_context(Datastore())
    cfg = parse_config("plugins: [{type: precise-prefix-cache-scorer, parameters: {kvEventsConfig: {enabled: false}}}]")
    build_pipeline(cfg, ctx)
    assert not [b for b in ctx.background if getattr(b, "__name__", "") == "warm"]
    warms = [b for b in ctx.services.warmups if getattr(b, "__name__", "") == "warm"]  # type: ignore[attr-defined]
    assert len(warms) == 1
    await warms[0]()


async def test_render_backend_against_the_simulators_render_api() -> None:
    """llm-d's `vllm` tokenizer: the model server's /v1/chat/completions/render and /v1/completions/render."""
    from e2e.sim.launch import start_in_thread
    from epp.framework import Params
    from epp.tokenization.factory import tokenizer_from_params

    sim = start_in_thread([], events=False)
    tok = tokenizer_from_params(Params("t", {"vllm": {"url": f"http://127.0.0.1:{sim.http_port}"}}))
    bad = tokenizer_from_params(Params("t", {"vllm": {"url": "http://127.0.0.1:1", "timeout": "200ms"}}))
    local = PromptTokenizer(HFBackend({QWEN25_MODEL: qwen25_tokenizer_dir()}))
    try:
        msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello there"}]
        assert await tok.tokenize(QWEN25_MODEL, messages=msgs) == await local.tokenize(QWEN25_MODEL, messages=msgs)
        assert await tok.tokenize(QWEN25_MODEL, prompt="The quick brown fox") == await local.tokenize(
            QWEN25_MODEL, prompt="The quick brown fox"
        )
        image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,"}}]}]
        with pytest.raises(TokenizationError, match="multimodal content needs the model server's renderer"):
            await local.tokenize(QWEN25_MODEL, messages=image)
        with pytest.raises(TokenizationError, match="/v1/chat/completions/render"):
            await bad.tokenize(QWEN25_MODEL, messages=msgs)
    finally:
        for t in (tok, bad, local):  # their HTTP sessions, as the runtime's shutdown closes them
            await t.close()
        sim.stop()


def test_cache_key_is_unambiguous_and_stable() -> None:
    key = PromptTokenizer._key
    msgs = [{"role": "user", "content": "hi\nthere é \ud800"}]  # a lone surrogate is a prompt like any other
    assert key("m", "chat", [msgs, {}, None]) == key("m", "chat", [[dict(msgs[0])], {}, None])
    distinct: list[object] = [
        ["ab"],
        ["a", "b"],
        {"a": "b"},
        ["a", "b", None],
        [True],
        [1],
        [1.0],
        ["1"],
        [[]],
        [{}],
        [None],
        [{"role": "user", "content": "x"}],
        [{"content": "x", "role": "user"}],  # key order renders: distinct
        [{"role": "user", "content": [{"type": "text", "text": "x"}]}],
    ]
    keys = [key("m", "chat", [c, {}, None]) for c in distinct]
    assert len(set(keys)) == len(distinct)
    assert key("m", "completion", "x") != key("m2", "completion", "x") != key("m", "chat", "x")
