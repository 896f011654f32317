"""Usage reading from JSON and SSE responses: split anywhere, last usage wins, garbage ignored, bounded."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epp.framework.types import Usage
from epp.protocol.usage import SSEUsageReader, usage_from_json, usage_from_object

SSE = (
    b'data: {"choices":[{"delta":{"content":"a"}}],"usage":null}\n\n'
    b'data: {"choices":[{"delta":{"content":"b\\u00e9"}}]}\r\n\r\n'
    b'data: {"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":2,"total_tokens":14}}\n\n'
    b"data: [DONE]\n\n"
)


def _continuous(n: int) -> list[bytes]:
    """vLLM's continuous usage stats: every chunk carries the cumulative usage."""
    return [
        b'data: {"choices":[{"text":"t"}],"usage":{"prompt_tokens":5,"completion_tokens":%d}}\n\n' % (i + 1)
        for i in range(n)
    ]


def test_usage_from_json_variants() -> None:
    chat = (
        b'{"object":"chat.completion","usage":{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15,'
        b'"prompt_tokens_details":{"cached_tokens":4}}}'
    )
    assert usage_from_json(chat) == Usage(10, 5, 15, 4, cached_tokens_reported=True)
    resp = (
        b'{"object":"response","usage":{"input_tokens":7,"output_tokens":2,"input_tokens_details":{"cached_tokens":1}}}'
    )
    assert usage_from_json(resp) == Usage(7, 2, 9, 1, cached_tokens_reported=True)
    # no details: 0 cached tokens, and not reported (vLLM without --enable-prompt-tokens-details)
    assert usage_from_json(b'{"usage":{"prompt_tokens":3,"prompt_tokens_details":null}}') == Usage(3, 0, 3)
    assert usage_from_json(b'{"usage": null}') is None
    assert usage_from_json(b"not json") is None
    assert usage_from_json(b"") is None
    assert usage_from_object({"type": "response.completed", "response": {"usage": {"input_tokens": 3}}}) == Usage(
        3, 0, 3
    )


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(SSE)), max_size=12))
def test_sse_usage_split_anywhere(cuts: list[int]) -> None:
    points = sorted(set(cuts))
    parts = [SSE[a:b] for a, b in zip([0, *points], [*points, len(SSE)], strict=True)]
    reader = SSEUsageReader()
    for p in parts:
        reader.feed(p)
    reader.close()
    assert reader.usage == Usage(12, 2, 14)


def test_sse_last_usage_wins_and_unterminated_last_line() -> None:
    r = SSEUsageReader()
    r.feed(b'data: {"usage":{"prompt_tokens":1,"completion_tokens":1}}\n\ndata: {"usage":{"prompt_tokens":1,')
    r.feed(b'"completion_tokens":3}}')
    assert r.usage == Usage(1, 1, 2)
    r.close()
    assert r.usage == Usage(1, 3, 4)


def test_sse_garbage_is_ignored() -> None:
    r = SSEUsageReader()
    r.feed(b'event: x\ndata: {"usage": broken\n: comment\ndata:\n\n')
    r.close()
    assert r.usage is None


def test_usage_ignores_absurd_token_counts() -> None:
    u = usage_from_json(b'{"usage":{"prompt_tokens":-4,"completion_tokens":' + b"9" * 500 + b"}}")
    assert u is not None and (u.prompt_tokens, u.completion_tokens) == (0, 0)


def test_sse_usage_parsed_once_per_stream_not_per_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    import epp.protocol.usage as usage_mod

    calls: list[bytes] = []
    real = usage_mod.json.loads

    def counting(b: bytes) -> object:
        calls.append(b)
        return real(b)

    monkeypatch.setattr(usage_mod.json, "loads", counting)
    r = SSEUsageReader()
    for c in _continuous(20):
        r.feed(c)
    r.feed(b'data: {"choices":[{"text":"u"}],"usage":null}\n\ndata: [DONE]\n\n')
    r.close()
    assert r.usage == Usage(5, 20, 25)
    assert len(calls) == 1  # the newest candidate only; "usage":null lines are not candidates


def test_sse_deferred_usage_keeps_in_order_semantics() -> None:
    # A later unparseable or usage-less candidate does not hide the last valid usage before it.
    r = SSEUsageReader()
    r.feed(b'data: {"usage":{"prompt_tokens":2,"completion_tokens":1}}\n\n')
    r.feed(b'data: {"usage": {"prompt_tokens": broken\n\n')
    r.feed(b'data: {"usage":"not an object"}\n\n')
    r.close()
    assert r.usage == Usage(2, 1, 3)


def test_sse_pending_candidates_bounded_and_exact() -> None:
    # Far more candidates than are held unparsed: the reader resolves as it goes, and still ends on the last usage
    # even when the newest candidates (past the bound) yield none.
    r = SSEUsageReader()
    for c in _continuous(100):
        r.feed(c)
    for _ in range(70):
        r.feed(b'data: {"usage":"x"}\n\n')
        assert len(r._pending) < 32
    r.close()
    assert r.usage == Usage(5, 100, 105)
