"""The response stage: status and headers, the body passed back (the model name rewritten back, content-length
dropped or set), usage from JSON or SSE, the response hooks, flow control's eviction and completion exactly once."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest

from epp.framework.types import InferenceRequest, Usage
from epp.requestcontrol.types import RoutingDecision
from epp.server.extproc import RequestStream
from epp.server.memtrim import TRIM_AFTER_BODY_BYTES, MemoryTrimmer
from tests.server.support import (
    Harness,
    Mode,
    body_msg,
    exchange,
    headers_msg,
    mutation,
    resp_body_msg,
    resp_headers_msg,
    stream_state,
)


async def test_streamed_response_rewrite_drops_content_length(epp: Harness) -> None:
    """FULL_DUPLEX_STREAMED: the length is unknown when the headers go out, so content-length is dropped (Envoy
    drops it too in this mode; not relying on that) and the body goes chunked. A response hook's headers stay."""
    epp.director.set_response_headers["x-session-token"] = "tok"
    call = epp.stub.Process()
    await exchange(call, [headers_msg(), body_msg(b'{"model":"alias","prompt":"x"}', True)], 2)
    rs = await exchange(
        call, [resp_headers_msg(extra={"content-length": "17"}), resp_body_msg(b'{"model":"real"}', True)], 2
    )
    assert mutation(rs[0].response_headers.response) == ({"x-session-token": "tok"}, ["content-length"])
    sr = rs[1].response_body.response.body_mutation.streamed_response
    assert (sr.body, sr.end_of_stream) == (b'{"model":"alias"}', True)
    assert mutation(rs[1].response_body.response) == ({}, [])
    call.cancel()


async def test_buffered_response_rewrite_fixes_content_length(epp: Harness) -> None:
    """Rewriting "real" back to "alias" makes the body longer: the upstream content-length is dropped at the
    headers phase (as GIE does) and, the whole body being known in BUFFERED mode, set to the new length with the
    body mutation (Envoy applies that header mutation before it checks the length, else it answers 500)."""
    call = epp.stub.Process()
    await exchange(call, [headers_msg(mode=Mode.BUFFERED), body_msg(b'{"model":"alias","prompt":"x"}', True)], 2)
    reply = b'{"id":"1","model":"real","usage":{"prompt_tokens":3,"completion_tokens":2}}'
    (rh,) = await exchange(call, [resp_headers_msg(extra={"content-length": str(len(reply))})], 1)
    assert mutation(rh.response_headers.response) == ({}, ["content-length"])
    (rb,) = await exchange(call, [resp_body_msg(reply, True)], 1)
    new = rb.response_body.response.body_mutation.body
    assert json.loads(new)["model"] == "alias"
    assert len(new) == len(reply) + 1
    assert mutation(rb.response_body.response) == ({"content-length": str(len(new))}, [])
    await call.done_writing()
    assert await call.read() is grpc.aio.EOF
    assert epp.director.completed == [("rid-1", Usage(prompt_tokens=3, completion_tokens=2, total_tokens=5))]


async def test_buffered_response_body_without_eos_is_flushed_whole(epp: Harness) -> None:
    """BUFFERED sends the whole body in one message, with end_of_stream false when trailers follow: the rewriter
    must not hold back a tail that could start a split model name (no later body message would carry it)."""
    call = epp.stub.Process()
    await exchange(call, [headers_msg(mode=Mode.BUFFERED), body_msg(b'{"model":"alias","prompt":"x"}', True)], 2)
    reply = b'{"model":"real","text":"ends in \\"'  # the last '"' could start '"model":"real"'
    await exchange(call, [resp_headers_msg(extra={"content-length": str(len(reply))})], 1)
    (rb,) = await exchange(call, [resp_body_msg(reply, False)], 1)
    new = rb.response_body.response.body_mutation.body
    assert new == b'{"model":"alias","text":"ends in \\"'
    assert mutation(rb.response_body.response) == ({"content-length": str(len(new))}, [])
    call.cancel()


@pytest.mark.parametrize("mode", [Mode.BUFFERED, Mode.FULL_DUPLEX_STREAMED])
async def test_response_without_rewrite_keeps_content_length(epp: Harness, mode: int) -> None:
    call = epp.stub.Process()
    await exchange(
        call, [headers_msg(mode=mode), body_msg(b'{"model":"m","prompt":"x"}', True)], 1 + (mode != Mode.BUFFERED)
    )
    reply = b'{"model":"m"}'
    rs = await exchange(call, [resp_headers_msg(extra={"content-length": "13"}), resp_body_msg(reply, True)], 2)
    assert not rs[0].response_headers.response.HasField("header_mutation")
    assert not rs[1].response_body.response.HasField("header_mutation")
    call.cancel()


async def test_bodyless_rewritten_response_keeps_its_headers(epp: Harness) -> None:
    """No body follows (e.g. a 204 / HEAD): nothing will be rewritten, so content-length is left alone."""
    call = epp.stub.Process()
    await exchange(call, [headers_msg(mode=Mode.BUFFERED), body_msg(b'{"model":"alias","prompt":"x"}', True)], 2)
    (rh,) = await exchange(call, [resp_headers_msg(status=204, extra={"content-length": "0"}, eos=True)], 1)
    assert not rh.response_headers.response.HasField("header_mutation")
    call.cancel()


async def test_sse_usage_served_metadata_and_completion_once(epp: Harness) -> None:
    call = epp.stub.Process()
    chat = b'{"model":"m","messages":[{"role":"user","content":"x"}],"stream":true}'
    await exchange(call, [headers_msg("/v1/chat/completions"), body_msg(chat, True)], 2)
    events = [
        b'data: {"model":"m","choices":[{"delta":{"content":"a"}}],"usage":null}\n\n',
        b'data: {"model":"m","choices":[],"usage":{"prompt_tokens":4,"completion_tokens":1,"total_tokens":5}}\n\n',
        b"data: [DONE]\n\n",
    ]
    stream = b"".join(events)
    parts = [stream[i : i + 13] for i in range(0, len(stream), 13)]
    msgs = [resp_headers_msg(ctype="text/event-stream", served="10.0.0.1:8000")]
    msgs += [resp_body_msg(p, i == len(parts) - 1) for i, p in enumerate(parts)]
    rs = await exchange(call, msgs, 1 + len(parts))
    assert b"".join(r.response_body.response.body_mutation.streamed_response.body for r in rs[1:]) == stream
    await call.done_writing()
    assert await call.read() is grpc.aio.EOF
    assert epp.director.response_headers == [(200, "10.0.0.1:8000")]
    assert epp.director.completed == [("rid-1", Usage(prompt_tokens=4, completion_tokens=1, total_tokens=5))]


async def test_huge_token_counts_do_not_skip_the_end_of_request_hook(epp: Harness) -> None:
    call = epp.stub.Process()
    await exchange(call, [headers_msg(), body_msg(b'{"model":"m","prompt":"x"}', True)], 2)
    usage = b'{"usage":{"prompt_tokens":3,"completion_tokens":' + b"9" * 400 + b"}}"
    await exchange(call, [resp_headers_msg(), resp_body_msg(usage, True)], 2)
    await call.done_writing()
    assert await call.read() is grpc.aio.EOF
    assert epp.director.completed == [("rid-1", Usage(prompt_tokens=3, completion_tokens=0, total_tokens=3))]


async def test_response_hook_failure_does_not_break_the_response(epp: Harness) -> None:
    epp.director.fail_response_headers = True
    call = epp.stub.Process()
    await exchange(call, [headers_msg(), body_msg(b'{"model":"m","prompt":"x"}', True)], 2)
    rs = await exchange(call, [resp_headers_msg(), resp_body_msg(b'{"ok":1}', True)], 2)
    assert rs[0].HasField("response_headers")
    assert rs[1].response_body.response.body_mutation.streamed_response.body == b'{"ok":1}'
    await call.done_writing()
    assert await call.read() is grpc.aio.EOF
    assert len(epp.director.completed) == 1


async def test_reported_attributes_go_to_envoy_with_the_last_body_message(epp: Harness) -> None:
    """request-attribute-reporter writes RESPONSE_METADATA at completion; the stream's last message carries it."""
    from epp.plugins.requestcontrol.request_attribute_reporter import RequestAttributeReporter
    from tests.helpers import build

    reporter = build(
        RequestAttributeReporter,
        {
            "attributes": [
                {"key": {"name": "x-cost"}, "expression": "usage.prompt_tokens + 2 * usage.completion_tokens"}
            ]
        },
    )
    recorded = epp.director.handle_response_complete

    def complete(request: InferenceRequest, decision: RoutingDecision | None, usage: Usage | None) -> None:
        recorded(request, decision, usage)
        reporter.response_complete(request, None, usage)

    epp.director.handle_response_complete = complete  # type: ignore[method-assign]
    epp.director.completes_before_last_answer = True  # as SchedulingDirector says when the reporter is configured
    call = epp.stub.Process()
    await exchange(call, [headers_msg(), body_msg(b'{"model": "m", "prompt": "x"}', True)], 2)
    reply = b'{"id":"1","model":"m","usage":{"prompt_tokens":3,"completion_tokens":2}}'
    rs = await exchange(
        call, [resp_headers_msg(), resp_body_msg(reply[:10], False), resp_body_msg(reply[10:], True)], 3
    )
    assert not rs[1].HasField("dynamic_metadata")
    assert rs[2].dynamic_metadata.fields["envoy.lb"].struct_value.fields["x-cost"].number_value == 7
    call.cancel()


async def test_an_evicted_in_flight_request_ends_with_an_immediate_429(epp: Harness) -> None:
    """flowControl.enableEviction: the decision's eviction event ends the stream mid-response (Envoy then resets the
    upstream request) and the director hears the completion once."""
    event = asyncio.Event()
    handle = epp.director.handle_request

    async def with_eviction(request: InferenceRequest, *, defer_records: bool = False) -> RoutingDecision:
        d = await handle(request, defer_records=defer_records)
        d.evicted = event
        return d

    epp.director.handle_request = with_eviction  # type: ignore[method-assign]
    call = epp.stub.Process()
    await exchange(call, [headers_msg(), body_msg(b'{"model": "m", "prompt": "x"}', True)], 2)
    await exchange(call, [resp_headers_msg(), resp_body_msg(b'data: {"choices":[]}\n\n', False)], 2)
    event.set()
    r = await asyncio.wait_for(call.read(), 5)
    assert r.HasField("immediate_response") and r.immediate_response.status.code == 429
    assert b"evicted" in r.immediate_response.body
    assert await asyncio.wait_for(call.read(), 5) is grpc.aio.EOF
    assert [rid for rid, _ in epp.director.completed] == ["rid-1"]


async def test_heap_is_trimmed_once_after_large_bodies() -> None:
    """Streams that carried a large body (decided or refused) ask for one debounced malloc_trim; small ones do not."""
    calls: list[int] = []
    state = stream_state(max_body_bytes=TRIM_AFTER_BODY_BYTES + 10)
    state.trimmer = MemoryTrimmer(delay=0.05, trim=lambda pad: calls.append(pad) or 1)  # type: ignore[func-returns-value]
    small = RequestStream(state)
    await small.handle(headers_msg("/v1/completions"))
    list(await small.handle(body_msg(b'{"model":"m","prompt":"x"}', True)))
    small.complete()
    await asyncio.sleep(0.2)
    assert calls == []
    big = b'{"model":"m","prompt":"' + b"x" * TRIM_AFTER_BODY_BYTES + b'"}'
    for _ in range(3):
        s = RequestStream(state)
        await s.handle(headers_msg("/v1/completions"))
        list(await s.handle(body_msg(big, True)))
        s.complete()
        s.complete()  # idempotent
    refused = RequestStream(state)  # refused while gathering (over the limit): trimmed after too
    await refused.handle(headers_msg("/v1/completions"))
    (r,) = list(await refused.handle(body_msg(big + b" " * 20, True)))
    assert r.immediate_response.status.code == 413
    refused.complete()
    for _ in range(100):
        if calls:
            break
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.2)
    assert calls == [0] and state.trimmer.trims == 1
