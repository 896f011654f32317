"""Every request API through Envoy + EPP to vLLM simulators publishing KV events (precise prefix-cache routing):
an Anthropic /v1/messages conversation and a Responses conversation keep going to the pod that caches their prefix
turn after turn; /inference/v1/generate token ids are routed by prefix with no tokenizer reachable; the
passthrough parser forwards an arbitrary body byte for byte; a bad /v1/messages body gets Anthropic's error shape.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.harness.backends import BackendPool
from e2e.harness.http import post_json, request
from e2e.harness.simconfig import sim_endpoints_yaml
from e2e.harness.stack import Stack, start_stack
from e2e.sim.launch import SimProcess, start_simulators
from epp.tokenization.qwen import QWEN25_MODEL, load_qwen25_tokenizer

pytestmark = pytest.mark.e2e

SYSTEM = "You are a contracts assistant. " + " ".join(
    f"Rule {i}: quote the clause number and keep answers under fifty words." for i in range(60)
)


def config(sims: list[SimProcess], tokenizer: str = "") -> str:
    lines = [
        "plugins:",
        *([f"  - type: token-producer\n    parameters: {tokenizer}"] if tokenizer else []),
        "  - type: precise-prefix-cache-scorer",
        "    parameters:",
        "      tokenProcessorConfig: {blockSize: 16, hashSeed: '7'}",
        "      kvEventsConfig: {topicFilter: 'kv@', concurrency: 2}",
        "  - type: max-score-picker",
        "schedulingProfiles:",
        "  - name: default",
        "    plugins: [{pluginRef: precise-prefix-cache-scorer, weight: 1}, {pluginRef: max-score-picker}]",
    ]
    return "\n".join(lines) + "\n" + sim_endpoints_yaml(sims)


@pytest.fixture(scope="module")
def sims() -> Iterator[list[SimProcess]]:
    with start_simulators(4, base_args=["--block-size", "16", "--model", QWEN25_MODEL], timeout=180) as s:
        yield s


@pytest.fixture
def stack(tmp_path: Path, sims: list[SimProcess]) -> Iterator[Stack]:
    s = start_stack(tmp_path, backends=[], config=config(sims))
    yield s
    s.close()


def _served(r: Any) -> tuple[int, int]:
    """The serving pod and the cached prompt tokens, read from each API's own usage shape."""
    assert r.status == 200, r.body
    usage = r.json()["usage"]
    if "cache_read_input_tokens" in usage:  # Anthropic Messages
        cached = usage["cache_read_input_tokens"]
    elif "input_tokens_details" in usage:  # Responses
        cached = usage["input_tokens_details"]["cached_tokens"]
    else:
        cached = usage["prompt_tokens_details"]["cached_tokens"]
    return int(r.headers["x-inference-port"]), int(cached)


def _conversation(stack: Stack, path: str, turn: Any) -> None:
    """Turn 1 lands somewhere; every later turn (the conversation so far + a new question) lands on the same pod and
    reuses the cached prefix. Four pods and score ties rotate: chance alone would rarely keep it there."""
    first, _ = _served(post_json(stack.url + path, turn(0)))
    time.sleep(0.3)  # the KV events of turn 1 reach the EPP
    for i in range(1, 4):
        port, cached = _served(post_json(stack.url + path, turn(i)))
        assert port == first
        assert cached >= 800  # the long system prompt and the earlier turns
        time.sleep(0.1)


def test_anthropic_messages_conversation_hits_its_cached_prefix(stack: Stack) -> None:
    def turn(n: int) -> dict[str, Any]:
        messages: list[dict[str, Any]] = []
        for i in range(n + 1):
            messages.append({"role": "user", "content": [{"type": "text", "text": f"Question {i} about clause {i}?"}]})
            if i < n:
                messages.append({"role": "assistant", "content": [{"type": "text", "text": f"Answer {i}."}]})
        return {"model": QWEN25_MODEL, "max_tokens": 2, "system": SYSTEM, "messages": messages}

    _conversation(stack, "/v1/messages", turn)


def test_responses_conversation_hits_its_cached_prefix(stack: Stack) -> None:
    def turn(n: int) -> dict[str, Any]:
        items: list[dict[str, Any]] = []
        for i in range(n + 1):
            items.append({"role": "user", "content": [{"type": "input_text", "text": f"Question {i}?"}]})
            if i < n:
                items.append({"type": "message", "role": "assistant",
                              "content": [{"type": "output_text", "text": f"Answer {i}."}]})  # fmt: skip
        return {"model": QWEN25_MODEL, "max_output_tokens": 2, "instructions": SYSTEM, "input": items}

    _conversation(stack, "/v1/responses", turn)


def test_bad_messages_body_gets_anthropics_error_shape(stack: Stack) -> None:
    r = post_json(stack.url + "/v1/messages", {"model": QWEN25_MODEL, "max_tokens": 2, "messages": []})
    assert r.status == 400
    assert r.json() == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "invalid messages request: must have at least one message",
        },
    }


def test_generate_token_ids_routed_by_prefix_without_a_tokenizer(tmp_path: Path, sims: list[SimProcess]) -> None:
    """The token-producer's tokenizer is a model server that does not exist: only pre-tokenized requests can be
    scored, and /inference/v1/generate ones follow their cached prefix."""
    unreachable = "{vllm: {url: 'http://127.0.0.1:1', timeout: 200ms}}"
    s = start_stack(tmp_path, backends=[], config=config(sims, tokenizer=unreachable))
    try:
        ids = list(load_qwen25_tokenizer()(SYSTEM)["input_ids"])
        first, _ = _served(post_json(s.url + "/inference/v1/generate",
                                     {"token_ids": [*ids, 11], "sampling_params": {"max_tokens": 2}}))  # fmt: skip
        time.sleep(0.3)
        for i in range(3):
            body = {"token_ids": [*ids, 100 + i, 7], "sampling_params": {"max_tokens": 2}}
            port, cached = _served(post_json(s.url + "/inference/v1/generate", body))
            assert port == first and cached >= 800
    finally:
        s.close()


def test_passthrough_routes_an_arbitrary_body_unchanged(tmp_path: Path) -> None:
    pool = BackendPool()
    backends = pool.start(2)
    eps = "".join(f"  - {{address: {b.host}, port: {b.port}}}\n" for b in backends)
    s = start_stack(tmp_path, backends=backends, config="endpoints:\n" + eps)
    try:
        body = bytes(range(256)) * 40 + b"not JSON, not any API"
        r = request(s.url + "/custom/v3/anything", "POST", body, {"content-type": "application/octet-stream"})
        assert r.status == 200, r.body
        echo = json.loads(r.body)["echo"]
        assert echo["path"] == "/custom/v3/anything"
        assert (echo["body_len"], echo["body_sha256"]) == (len(body), hashlib.sha256(body).hexdigest())
    finally:
        s.close()
        pool.close()
