"""A large request body is parsed off the event loop (issue 15: a 100 MiB prompt's parse ran on the loop and every
other stream stalled meanwhile): on the parse thread, with the same result and the same 400s."""

from __future__ import annotations

import asyncio
import json
import random
import time
from typing import Any

import pytest

from epp.framework import BadRequest
from epp.framework.parsing import LARGE_BODY_BYTES
from epp.plugins.parsers._common import decode_json_object
from epp.server.extproc import RequestStream
from tests.server.support import body_msg, headers_msg, stream_state


def _text(n: int, seed: int, nasty: bool = True) -> str:
    """Prompt-like text; `nasty` adds what makes splitting hard: escapes of every kind, multi-byte characters,
    astral characters (surrogate pairs when escaped), quotes and backslashes, at random places."""
    rng = random.Random(seed)
    alphabet = ["word ", "other ", "\n", "é", "x"]
    weights = [40, 40, 4, 2, 10]
    if nasty:
        alphabet += ['"', "\\", "\t", "ü", "中文", "😀", "\x7f", "\u2028", "/"]
        weights += [2, 2, 1, 2, 2, 2, 1, 1, 1]
    return "".join(rng.choices(alphabet, weights, k=n // 4))


def test_large_body_decodes_as_the_stdlib_does() -> None:
    body = {"model": "m", "prompt": _text(LARGE_BODY_BYTES + 1000, 7), "n": [{"a": [1, 2.5, None, True]}] * 200}
    data = json.dumps(body, ensure_ascii=False).encode()
    assert len(data) >= LARGE_BODY_BYTES
    assert decode_json_object(data) == body == json.loads(data)
    deep = b'{"model": "m", "prompt": "' + b"a" * LARGE_BODY_BYTES + b'", "x": ' + b"[" * 200 + b"]" * 200 + b"}"
    with pytest.raises(BadRequest, match="nests deeper than 128 levels"):
        decode_json_object(deep)


@pytest.mark.parametrize(
    "data",
    [
        json.dumps(["a" * LARGE_BODY_BYTES]).encode(),  # not an object: the same 400 as before
        json.dumps({"k" * LARGE_BODY_BYTES: 1}).encode(),  # a huge key
        b'{"model": "m", "prompt": "' + b"a" * LARGE_BODY_BYTES + b'\x01"}',  # a raw control character
        b'{"model": "m", "prompt": "' + b"a" * LARGE_BODY_BYTES + b'\\ud800"}',  # a lone surrogate escape
        b'{"model": "m", "prompt": "' + b"\\n" * LARGE_BODY_BYTES + b'"}',  # escapes everywhere
        b'{"model": "m", "prompt": "' + b"a" * LARGE_BODY_BYTES + b'", "x": NaN}',  # what only the stdlib reads
        b'{"model": "m", "prompt": "' + b"a" * LARGE_BODY_BYTES,  # unterminated
        b'{"model": "m", "prompt": "' + b"a" * LARGE_BODY_BYTES + b'"',  # truncated
    ],
    ids=["list", "huge-key", "control", "surrogate", "dense-escapes", "nan", "unterminated", "truncated"],
)
def test_large_odd_bodies_are_judged_as_small_ones(data: bytes) -> None:
    try:
        expected: Any = json.loads(data)
    except ValueError:
        expected = BadRequest
    if expected is BadRequest or not isinstance(expected, dict):
        with pytest.raises(BadRequest):
            decode_json_object(data)
        return
    got = decode_json_object(data)
    assert json.dumps(got, sort_keys=True) == json.dumps(expected, sort_keys=True)


async def test_small_request_is_not_blocked_by_a_huge_body_being_parsed() -> None:
    """A 48 MiB prompt's parse runs on the parse thread: a small request sent meanwhile is routed before the huge
    one is, and the event loop keeps ticking during the parse (before, the loop did not run until it was over)."""
    state = stream_state()
    prompt = _text(1 << 20, 3, nasty=False) * 48  # ~48 MiB of prompt-like text
    big = json.dumps({"model": "m", "prompt": prompt}).encode()
    huge = RequestStream(state)
    await huge.handle(headers_msg("/v1/completions"))
    done: list[str] = []
    ticks = 0

    async def run_huge() -> None:
        out = await huge.handle(body_msg(big, True))
        next(iter(out))
        done.append("huge")

    async def ticker() -> None:
        nonlocal ticks
        while "huge" not in done:
            ticks += 1
            await asyncio.sleep(0.001)

    task = asyncio.create_task(run_huge())
    tick_task = asyncio.create_task(ticker())
    await asyncio.sleep(0)  # the huge request is handed to the parse thread
    t0 = time.monotonic()
    small = RequestStream(state)
    await small.handle(headers_msg("/v1/completions"))
    (routed, *_) = list(await small.handle(body_msg(json.dumps({"model": "m", "prompt": "hi"}).encode(), True)))
    small_took = time.monotonic() - t0
    done.append("small")
    assert routed.request_headers.response.header_mutation.set_headers[0].header.key == "x-gateway-destination-endpoint"
    await task
    await tick_task
    assert done == ["small", "huge"], f"small took {small_took:.3f}s"
    assert ticks >= 3
    assert huge.request is not None and huge.request.prompt == prompt


async def test_huge_malformed_body_is_a_clean_400_from_the_parse_thread() -> None:
    state = stream_state()
    s = RequestStream(state)
    await s.handle(headers_msg("/v1/chat/completions"))
    bad = b'{"model": "m", "messages": [{"role": "user", "content": "' + b"a" * LARGE_BODY_BYTES + b'\x01"}]}'
    (r,) = list(await s.handle(body_msg(bad, True)))
    assert r.immediate_response.status.code == 400
    assert "not valid JSON" in json.loads(r.immediate_response.body)["error"]["message"]
    assert state.inflight_body_bytes == 0
