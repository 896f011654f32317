"""Micro-benchmark of the ext_proc hot path, in process (no gRPC transport): parse + decide per request.

Side by side in one run:
  floor     — the protobuf work any ext_proc server must do: parse the request_headers and request_body messages,
              build + serialize one HeaderMutation response and one streamed body response (upb);
  pyepp     — the same wire messages through `RequestStream.handle` (header map, JSON parse, RoundRobinDirector,
              metrics, response building) + serializing the responses;
  big bodies — 2 MiB vs 8 MiB in 62 KB chunks, next to json.loads alone, to show the gather adds no quadratic cost.
Prints medians of `--repeats` runs and the ratios.  Run: `python -m e2e.bench.cost.extproc`.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from prometheus_client import CollectorRegistry

from e2e.harness.directors import RoundRobinDirector
from epp.datalayer.datastore import Datastore
from epp.framework.types import Endpoint
from epp.server.extproc import RequestStream, ServerState
from epp.server.metrics import RequestMetrics

FULL_DUPLEX = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED


def wire_messages(body: bytes, chunk: int = 62_000) -> list[bytes]:
    names = {
        ":path": "/v1/chat/completions",
        ":method": "POST",
        ":authority": "gw",
        ":scheme": "http",
        "content-type": "application/json",
        "user-agent": "bench/1.0",
        "x-request-id": "0b1c2d3e-aaaa-bbbb-cccc-000000000000",
        "x-forwarded-proto": "http",
        "accept": "*/*",
    }
    hdr = pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(
            headers=base_pb2.HeaderMap(
                headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in names.items()]
            )
        ),
        protocol_config=pb.ProtocolConfiguration(request_body_mode=FULL_DUPLEX, response_body_mode=FULL_DUPLEX),
    )
    return [hdr.SerializeToString(), *body_messages("request_body", chunks(body, chunk))]


def chunks(body: bytes, size: int) -> list[bytes]:
    return [body[i : i + size] for i in range(0, len(body), size)]


def body_messages(field: str, parts: Sequence[bytes]) -> list[bytes]:
    """Body parts as Envoy streams them: serialized ProcessingRequests of `field` (request_body or response_body),
    the last one ending the stream."""
    return [
        pb.ProcessingRequest(**{field: pb.HttpBody(body=p, end_of_stream=i == len(parts) - 1)}).SerializeToString()
        for i, p in enumerate(parts)
    ]


def chat_body(size: int) -> bytes:
    base: dict[str, Any] = {"model": "qwen", "messages": [{"role": "user", "content": ""}], "max_tokens": 16}
    pad = size - len(json.dumps(base))
    base["messages"][0]["content"] = "x" * max(0, pad)
    return json.dumps(base).encode()


def floor_once(wire: list[bytes]) -> None:
    msgs = [pb.ProcessingRequest.FromString(w) for w in wire]
    body = msgs[-1].request_body.body
    resp = pb.ProcessingResponse(
        request_headers=pb.HeadersResponse(
            response=pb.CommonResponse(
                header_mutation=pb.HeaderMutation(
                    set_headers=[
                        base_pb2.HeaderValueOption(
                            header=base_pb2.HeaderValue(
                                key="x-gateway-destination-endpoint", raw_value=b"10.0.0.1:8000"
                            ),
                            append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
                        )
                    ]
                )
            )
        )
    )
    resp.SerializeToString()
    b = pb.ProcessingResponse()
    b.request_body.response.body_mutation.streamed_response.body = body
    b.SerializeToString()


async def pyepp_once(state: ServerState, wire: list[bytes]) -> None:
    stream = RequestStream(state)
    for w in wire:
        for r in await stream.handle(pb.ProcessingRequest.FromString(w)):
            r.SerializeToString()
    stream.complete()


def bench(fn: Callable[[], object], n: int, repeats: int) -> float:
    """Median µs per call over `repeats` runs of n calls."""
    runs = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        runs.append((time.perf_counter() - t) / n * 1e6)
    return statistics.median(runs)


def bench_async(loop: asyncio.AbstractEventLoop, state: ServerState, wire: list[bytes], n: int, repeats: int) -> float:
    """Like `bench`, but the n requests run inside one coroutine (as on the server's loop)."""

    async def run() -> None:
        for _ in range(n):
            await pyepp_once(state, wire)

    runs = []
    for _ in range(repeats):
        t = time.perf_counter()
        loop.run_until_complete(run())
        runs.append((time.perf_counter() - t) / n * 1e6)
    return statistics.median(runs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=3000)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    ds = Datastore()
    ds.replace_all([Endpoint(name=f"ep{i}", address="10.0.0.1", port=8000 + i) for i in range(8)])
    registry = CollectorRegistry()
    state = ServerState(RoundRobinDirector(ds), ds, RequestMetrics(registry))
    loop = asyncio.new_event_loop()

    print(f"{'case':34} {'floor µs':>10} {'pyepp µs':>10} {'ratio':>7}")
    for size in (1024, 16 * 1024):
        wire = wire_messages(chat_body(size))
        f = bench(functools.partial(floor_once, wire), args.n, args.repeats)
        p = bench_async(loop, state, wire, args.n, args.repeats)
        print(f"{'headers + ' + str(size // 1024) + ' KiB chat body':34} {f:10.1f} {p:10.1f} {p / f:7.2f}")
    # One SSE event on the response path (the most frequent message of a streaming request).
    event = (
        b'data: {"id":"c","object":"chat.completion.chunk","model":"qwen","choices":[{"delta":{"content":"tok "}}]}\n\n'
    )
    chunk_wire = pb.ProcessingRequest(response_body=pb.HttpBody(body=event)).SerializeToString()

    def floor_chunk() -> None:
        body = pb.ProcessingRequest.FromString(chunk_wire).response_body.body
        r = pb.ProcessingResponse()
        r.response_body.response.body_mutation.streamed_response.body = body
        r.SerializeToString()

    # a routed request whose response is an event stream, as the servicer sees it
    stream = RequestStream(state)
    for m in wire_messages(chat_body(1024)):
        loop.run_until_complete(stream.handle(pb.ProcessingRequest.FromString(m)))
    sse_headers = [(":status", b"200"), ("content-type", b"text/event-stream")]
    response_headers = pb.ProcessingRequest(
        response_headers=pb.HttpHeaders(
            headers=base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=k, raw_value=v) for k, v in sse_headers])
        )
    )
    loop.run_until_complete(stream.handle(response_headers))

    async def pyepp_chunks(n: int) -> None:
        for _ in range(n):
            for r in await stream.handle(pb.ProcessingRequest.FromString(chunk_wire)):
                r.SerializeToString()

    f = bench(floor_chunk, args.n, args.repeats)
    runs = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        loop.run_until_complete(pyepp_chunks(args.n))
        runs.append((time.perf_counter() - t) / args.n * 1e6)
    p = statistics.median(runs)
    print(f"{'SSE response chunk (usage reader on)':34} {f:10.1f} {p:10.1f} {p / f:7.2f}")
    small = wire_messages(chat_body(2 * 1024 * 1024))
    big = wire_messages(chat_body(8 * 1024 * 1024))
    n = max(5, args.n // 300)
    t2 = bench_async(loop, state, small, n, args.repeats)
    t8 = bench_async(loop, state, big, n, args.repeats)
    small_body, big_body = chat_body(2 * 1024 * 1024), chat_body(8 * 1024 * 1024)
    j2 = bench(lambda: json.loads(small_body), n, args.repeats)
    j8 = bench(lambda: json.loads(big_body), n, args.repeats)
    print(f"big bodies (62 KB chunks): 2 MiB {t2 / 1000:.2f} ms, 8 MiB {t8 / 1000:.2f} ms, ratio {t8 / t2:.2f}")
    print(f"  of which json.loads alone: 2 MiB {j2 / 1000:.2f} ms, 8 MiB {j8 / 1000:.2f} ms, ratio {j8 / j2:.2f}")
    print(f"  the rest (gather, re-chunk, protobuf): 2 MiB {(t2 - j2) / 1000:.2f} ms, 8 MiB {(t8 - j8) / 1000:.2f} ms")
    loop.close()


if __name__ == "__main__":
    main()
