"""One pick's CPU in process: `cost.picks`' two messages (request headers, a 1024-token completion body) and the
stream's end through `RequestStream`, 64 picks in flight on one event loop, no gRPC. It isolates the EPP's own
request path from the transport that `cost.picks` measures around it; thread CPU, so a busy box inflates it less
than wall time.

    python -m e2e.bench.cost.pick_path --strategies random,precise,pyepp-default --picks 4096 --repeats 5
    python -m e2e.bench.cost.pick_path --strategies pyepp-default --phases     # CPU per director phase

The endpoints are four static ones with a scraped KV capacity (512 blocks of 16) and no KV events, as the
simulators of `cost.picks` are (they never receive a request there): the precise index holds only this EPP's
speculative entries, and pyepp-default's approximateFallback matches every endpoint from its routing history
(`--publishing`: as with `cost.picks --warm-sims`, every endpoint counts as publishing, the fallback is off).
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from prometheus_client import CollectorRegistry

from e2e.bench.cost.picks import grpc_frames
from e2e.strategies import chain_config
from e2e.workloads.text import TextFactory
from epp.config import parse_config
from epp.framework.types import Endpoint, Metrics
from epp.server.extproc import RequestStream, ServerState
from epp.server.metrics import RequestMetrics
from epp.wiring.runtime import build_runtime


def messages(prompt_tokens: int = 1024) -> list[bytes]:
    """The serialized ProcessingRequests of one cost.picks stream."""
    prompt = TextFactory(5).text("picks", prompt_tokens)
    body = json.dumps({"model": "Qwen/Qwen2.5-0.5B-Instruct", "prompt": prompt, "max_tokens": 16}).encode()
    raw, out = grpc_frames(body), []
    while raw:
        n = int.from_bytes(raw[1:5], "big")
        out.append(raw[5 : 5 + n])
        raw = raw[5 + n :]
    return out


def server_state(strategy: str, publishing: bool = False) -> ServerState:
    eps = "endpoints:\n" + "".join(f"- {{name: ep{i}, address: 127.0.0.1, port: {9000 + i}}}\n" for i in range(4))
    rt = build_runtime(parse_config(chain_config(strategy) + eps, source="bench"))
    endpoints = [Endpoint(name=f"ep{i}", address="127.0.0.1", port=9000 + i) for i in range(4)]
    for e in endpoints:
        e.metrics = Metrics(cache_block_size=16, cache_num_blocks=512, update_time=time.monotonic())
    rt.datastore.replace_all(endpoints)
    if publishing and rt.pipeline is not None:  # as if every engine had published KV events: the index alone matches
        for plugin in rt.pipeline.plugins.values():
            applier = getattr(getattr(plugin, "index", None), "applier", None)
            if applier is not None:
                applier.publishing.update(e.hostport for e in endpoints)
    return ServerState(rt.director, rt.datastore, RequestMetrics(CollectorRegistry()))


async def one(state: ServerState, wires: Sequence[bytes]) -> None:
    s = RequestStream(state)
    for w in wires:
        for r in await s.handle(pb.ProcessingRequest.FromString(w)):
            r.SerializeToString()
    s.complete()  # the stream's end: the director hears completion, as ExtProcServicer.Process does
    if s.decision is None:  # an error answer costs less or more than a pick: its time is not a pick's
        raise RuntimeError("a stream ended without a pick (an error answer): see the log above")


async def picks(state: ServerState, wires: Sequence[bytes], n: int, in_flight: int = 64) -> None:
    for _ in range(max(1, n // in_flight)):
        await asyncio.gather(*(one(state, wires) for _ in range(in_flight)))


def _timed(acc: dict[str, float], label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    if inspect.iscoroutinefunction(fn):

        async def timed_async(*a: Any, **kw: Any) -> Any:
            t = time.thread_time()
            try:
                return await fn(*a, **kw)
            finally:
                acc[label] = acc.get(label, 0.0) + time.thread_time() - t

        return timed_async

    def timed(*a: Any, **kw: Any) -> Any:
        t = time.thread_time()
        try:
            return fn(*a, **kw)
        finally:
            acc[label] = acc.get(label, 0.0) + time.thread_time() - t

    return timed


def instrument(state: ServerState, acc: dict[str, float]) -> None:
    """Thread CPU per director phase (a producer's time includes what it awaits on this thread)."""
    d: Any = state.director
    d.handle_request = _timed(acc, "director (total)", d.handle_request)
    for p in d.pipeline.producers:
        p.prepare = _timed(acc, f"  producer {p.name}", p.prepare)
    d.scheduler.schedule = _timed(acc, "  scheduling", d.scheduler.schedule)
    for h in d.pipeline.pre_request:
        h.pre_request = _timed(acc, f"  pre-request {h.name}", h.pre_request)
    d.handle_response_complete = _timed(acc, "response-complete hooks", d.handle_response_complete)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m e2e.bench.cost.pick_path")
    p.add_argument("--strategies", default="random,precise,pyepp-default")
    p.add_argument("--picks", type=int, default=4096)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--phases", action="store_true", help="also the CPU per director phase (one more run)")
    p.add_argument(
        "--publishing",
        action="store_true",
        help="the endpoints count as KV-event publishers (cost.picks --warm-sims): no approximate fallback",
    )
    ns = p.parse_args(argv)
    wires = messages()
    loop = asyncio.new_event_loop()
    states = {s: server_state(s, ns.publishing) for s in ns.strategies.split(",")}
    for st in states.values():
        for _ in range(8):  # the prompt's first tokenizations (the tokenizer loads), one at a time
            loop.run_until_complete(one(st, wires))
        loop.run_until_complete(picks(st, wires, 512))  # warm: tokenizer cache, index, histories
    runs: dict[str, list[float]] = {s: [] for s in states}
    for _ in range(ns.repeats):  # strategies alternated
        for s, st in states.items():
            t = time.thread_time()
            loop.run_until_complete(picks(st, wires, ns.picks))
            runs[s].append((time.thread_time() - t) / ns.picks * 1e6)
    for s, v in runs.items():
        print(f"{s}: median {statistics.median(v):.0f} µs CPU per pick ({', '.join(f'{x:.0f}' for x in v)})")
    if ns.phases:
        for s, st in states.items():
            acc: dict[str, float] = {}
            instrument(st, acc)
            t = time.thread_time()
            loop.run_until_complete(picks(st, wires, ns.picks))
            total = time.thread_time() - t
            print(f"{s}: {total / ns.picks * 1e6:.0f} µs per pick; phases:")
            for k, secs in sorted(acc.items(), key=lambda kv: not kv[0].startswith("director")):
                print(f"  {k:50s} {secs / ns.picks * 1e6:7.1f}")
    loop.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
