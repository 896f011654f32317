"""Where one request's time goes inside the EPP, and the Python floor beside it.

Part 1, in process (no transport): the wire messages Envoy sends for one request go through `RequestStream`
with a timer around every phase: protobuf parse of each message, body gathering, JSON parse, each DataProducer
(tokenization is the token-producer; the precise producer's KV lookup), scheduling, PreRequest hooks, response
building and serialization, the response headers, every response body message (JSON usage or SSE events) and
the end-of-request hooks. Approximate and precise chains, 1k and 8k-token prompts, first sight of each prompt
(tokenizer cache cold) and a repeat (warm), non-streaming and SSE responses. Medians in µs per request.

Part 2, through a real Envoy, side by side in one run at the same open-loop rate: Envoy alone (the client names
the pod), Envoy + the Python floor (`cost.floor`: same protos and message sequence, fixed destination), and
Envoy + the EPP (each chain). Added latency = path − Envoy alone; ours over the floor is what we can cut. Each
path sends to a simulator pool of its own, so an EPP ingests only its own requests' KV events (`--shared-pool`:
one pool for all, as before 2026-12-04).

    python -m e2e.bench.cost.breakdown                     # both parts
    python -m e2e.bench.cost.breakdown --part 2 --points 1024:10,50 --chains precise --sims 4 --repeats2 5
    python -m e2e.bench.cost.breakdown --part 2 --points 1024:50 --chains precise --no-response-path  # routing only
    python -m e2e.bench.cost.breakdown --part 3 --chains precise [--epp-args '--refresh-metrics-interval 10s']
    python -m e2e.bench.cost.breakdown --part 4 --chains precise --variants 'scrape10s=--refresh-metrics-interval 10s'

Part 3, without Envoy: requests one at a time straight to the EPP's and the floor's gRPC ports (the messages Envoy
would send), alternated; the request phase (headers + body → destination + body) and the response phase (response
headers + body messages) per server. Their difference is what the EPP process adds per message, transport included.

Part 4, no requests: the idle CPU of the EPP (and of each `--variants` flag set) and of the floor next to the same
simulators: the background work (metrics scrapes, KV-event subscriptions, gauges) that competes with serving.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from prometheus_client import CollectorRegistry

from e2e.bench.cost.extproc import body_messages, chunks
from e2e.bench.loadgen import percentile
from e2e.bench.procstat import cpu_seconds
from e2e.harness.envoy_config import EnvoyOptions
from e2e.harness.ports import free_port, free_ports
from e2e.harness.procs import EnvoyProcess, _Process
from e2e.harness.stack import start_stack
from e2e.sim.launch import start_simulators
from e2e.strategies import PROFILES, config_text
from e2e.workloads.text import TextFactory
from epp.config import parse_config
from epp.framework.types import Endpoint
from epp.server.extproc import RequestStream, ServerState
from epp.server.metrics import RequestMetrics
from epp.server.stages import parse as parse_stage
from epp.wiring.runtime import build_runtime

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
DEST = "x-gateway-destination-endpoint"
CHAINS = ("approximate", "precise")
# Part 1's clock: process CPU time by default, so a shared, overloaded box (other jobs preempting us) does not
# inflate the phases; `--clock wall` for wall time. Tokenization offloaded to the tokenizer thread is included.
CLOCK = time.process_time


# -- part 1: in process --------------------------------------------------------------------------------------


class Timers:
    def __init__(self) -> None:
        self.acc: dict[str, float] = defaultdict(float)

    def add(self, name: str, seconds: float) -> None:
        self.acc[name] += seconds

    def wrap_sync(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*a: Any, **kw: Any) -> Any:
            t = CLOCK()
            try:
                return fn(*a, **kw)
            finally:
                self.acc[name] += CLOCK() - t

        return timed

    def wrap_async(self, name: str, fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def timed(*a: Any, **kw: Any) -> Any:
            t = CLOCK()
            try:
                return await fn(*a, **kw)
            finally:
                self.acc[name] += CLOCK() - t

        return timed


def _hdrs(pairs: dict[str, str]) -> base_pb2.HeaderMap:
    return base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs.items()])


def request_wire(prompt: str, stream: bool, chunk: int = 62_000) -> list[bytes]:
    body = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 16, "stream": stream}).encode()
    out = [
        pb.ProcessingRequest(
            request_headers=pb.HttpHeaders(
                headers=_hdrs(
                    {
                        ":method": "POST",
                        ":path": "/v1/completions",
                        ":authority": "gw",
                        "content-type": "application/json",
                        "x-request-id": "r",
                    }
                )
            )
        ).SerializeToString()
    ]
    return out + body_messages("request_body", chunks(body, chunk))


def response_wire(stream: bool, n_tokens: int = 16) -> list[bytes]:
    if stream:
        ct = "text/event-stream"
        events = [
            b'data: {"id":"c","object":"text_completion","model":"%s","choices":[{"index":0,"text":"tok "}]}\n\n'
            % MODEL.encode()
            for _ in range(n_tokens)
        ]
        events.append(
            b'data: {"id":"c","object":"text_completion","model":"%s","choices":[],"usage":{"prompt_tokens":1000,'
            b'"completion_tokens":16,"total_tokens":1016}}\n\ndata: [DONE]\n\n' % MODEL.encode()
        )
    else:
        ct = "application/json"
        events = [
            json.dumps(
                {
                    "id": "c",
                    "object": "text_completion",
                    "model": MODEL,
                    "choices": [{"index": 0, "text": "tok " * n_tokens, "finish_reason": "length"}],
                    "usage": {"prompt_tokens": 1000, "completion_tokens": 16, "total_tokens": 1016},
                }
            ).encode()
        ]
    out = [
        pb.ProcessingRequest(
            response_headers=pb.HttpHeaders(headers=_hdrs({":status": "200", "content-type": ct}))
        ).SerializeToString()
    ]
    return out + body_messages("response_body", events)


def _runtime(chain: str, timers: Timers) -> ServerState:
    eps = "endpoints:\n" + "".join(f"- {{name: ep{i}, address: 127.0.0.1, port: {9000 + i}}}\n" for i in range(4))
    cfg = parse_config(PROFILES[chain].format(block_size=16).lstrip() + eps, source="bench")
    rt = build_runtime(cfg)
    rt.datastore.replace_all([Endpoint(name=f"ep{i}", address="127.0.0.1", port=9000 + i) for i in range(4)])
    director: Any = rt.director
    director.handle_request = timers.wrap_async("director (total)", director.handle_request)
    director.scheduler.schedule = timers.wrap_sync("  scheduling", director.scheduler.schedule)
    for p in director.pipeline.producers:
        label = "  producer " + p.name + (" (tokenization)" if "token" in p.name and "prefix" not in p.name else "")
        p.prepare = timers.wrap_async(label, p.prepare)
    for h in director.pipeline.pre_request:
        h.pre_request = timers.wrap_sync("  pre-request " + h.name, h.pre_request)
    director.handle_response_complete = timers.wrap_sync("response complete hooks", director.handle_response_complete)
    state = ServerState(rt.director, rt.datastore, RequestMetrics(CollectorRegistry()))
    resolve = state.parsers.resolve
    wrapped: dict[int, Any] = {}

    def timed_resolve(path: str) -> Any:
        parser = resolve(path)
        if id(parser) not in wrapped:
            parser.parse = timers.wrap_sync("  parse body (JSON)", parser.parse)  # type: ignore[method-assign]
            wrapped[id(parser)] = parser
        return parser

    state.parsers.resolve = timed_resolve  # type: ignore[method-assign]
    return state


async def _one(state: ServerState, timers: Timers, req: list[bytes], resp: list[bytes]) -> None:
    s = RequestStream(state)
    for wire in (req, resp):
        for w in wire:
            t = CLOCK()
            msg = pb.ProcessingRequest.FromString(w)
            t1 = CLOCK()
            timers.add("protobuf parse (all messages)", t1 - t)
            kind = msg.WhichOneof("request")
            out = await s.handle(msg)
            t2 = CLOCK()
            name = {
                "request_headers": "request headers",
                "request_body": "request body (gather + decide)",
                "response_headers": "response headers",
                "response_body": "response body (usage, rewrite)",
            }[kind]
            timers.add(name, t2 - t1)
            for r in out:
                r.SerializeToString()
            timers.add("protobuf serialize (all responses)", CLOCK() - t2)


def part1(n: int, repeats: int) -> list[dict[str, Any]]:
    texts = TextFactory(7)
    rows: list[dict[str, Any]] = []
    parse_t = Timers()
    parse_stage.build_request = parse_t.wrap_sync("  build request (+ model rewrite)", parse_stage.build_request)
    for chain in CHAINS:
        timers = Timers()
        state = _runtime(chain, timers)
        loop = asyncio.new_event_loop()
        for tokens in (1024, 8192):
            for stream in (False, True):
                resp = response_wire(stream)
                for cache in ("cold", "warm"):
                    runs: list[dict[str, float]] = []
                    for r in range(repeats):
                        prompts = [texts.text(("bd", chain, tokens, stream, r, i), tokens) for i in range(n)]
                        wires = [request_wire(p, stream) for p in prompts]
                        if cache == "warm":  # the tokenizer and prefix caches have seen these prompts
                            for w in wires:
                                loop.run_until_complete(_one(state, Timers(), w, resp))
                        timers.acc.clear()
                        parse_t.acc.clear()
                        t = CLOCK()
                        for w in wires:
                            loop.run_until_complete(_one(state, timers, w, resp))
                        total = CLOCK() - t
                        acc = dict(timers.acc) | dict(parse_t.acc)
                        acc["TOTAL"] = total
                        runs.append({k: v / n * 1e6 for k, v in acc.items()})
                    med = {k: statistics.median(r.get(k, 0.0) for r in runs) for k in runs[0]}
                    rows.append({"chain": chain, "tokens": tokens, "sse": stream, "cache": cache, "us": med})
        loop.close()
    return rows


def print_part1(rows: list[dict[str, Any]]) -> None:
    names: list[str] = []
    for r in rows:
        for k in r["us"]:
            if k not in names:
                names.append(k)
    order = [
        "protobuf parse (all messages)",
        "request headers",
        "request body (gather + decide)",
        "  parse body (JSON)",
        "  build request (+ model rewrite)",
        "director (total)",
    ]
    names = [n for n in order if n in names] + sorted(n for n in names if n not in order and n != "TOTAL") + ["TOTAL"]
    heads = [f"{r['chain'][:6]} {r['tokens'] // 1024}k {'sse' if r['sse'] else 'json'} {r['cache']}" for r in rows]
    clock = "CPU" if CLOCK is time.process_time else "wall"
    print(f"\n# part 1: µs per request in process ({clock}, median of repeats)")
    print(f"{'phase':44}" + "".join(f"{h:>22}" for h in heads))
    for n in names:
        print(f"{n[:44]:44}" + "".join(f"{r['us'].get(n, 0.0):>22.1f}" for r in rows))


# -- part 2: through Envoy -----------------------------------------------------------------------------------


class FloorProcess(_Process):
    def __init__(self, workdir: Path, destination: str, event_loop: str = "asyncio", python: str | None = None) -> None:
        self.port, self.health_port = free_ports(2)
        argv = [
            python or sys.executable,
            "-m",
            "e2e.bench.cost.floor",
            "--port",
            str(self.port),
            "--health-port",
            str(self.health_port),
            "--destination",
            destination,
            "--event-loop",
            event_loop,
        ]
        super().__init__("floor", argv, workdir / f"floor-{event_loop}.log")

    def wait_ready(self, timeout: float = 20.0) -> None:
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with grpc.insecure_channel(f"127.0.0.1:{self.health_port}") as ch:
                    st = health_pb2_grpc.HealthStub(ch).Check(
                        health_pb2.HealthCheckRequest(service="readiness"), timeout=1
                    )
                    if st.status == health_pb2.HealthCheckResponse.SERVING:
                        return
            except grpc.RpcError:
                time.sleep(0.05)
        raise self.fail("floor not ready")

    def envoy_in_front(self, workdir: Path, response_path: bool = True,
                       overrides: dict[str, object] | None = None) -> EnvoyProcess:  # fmt: skip
        """Wait for the floor, then start (and wait for) an Envoy whose ext_proc cluster is this floor (`overrides`:
        more EnvoyOptions, as start_stack's `envoy_overrides`)."""
        self.wait_ready()
        lp, ap = free_ports(2)
        opts = EnvoyOptions(listener_port=lp, admin_port=ap, ext_proc_port=self.port, response_path=response_path)
        for k, v in (overrides or {}).items():
            setattr(opts, k, v)
        envoy = EnvoyProcess(opts, workdir)
        envoy.wait_ready()
        return envoy


def interleaved(names: Sequence[str], rounds: int, rng: random.Random) -> list[str]:
    """`rounds` rounds of one request per path, each round in its own random order: every path is sent after every
    other about equally often, so none is always the one sent right after the heaviest."""
    return [k for _ in range(rounds) for k in rng.sample(list(names), len(names))]


async def _measure(
    paths: dict[str, tuple[str, list[dict[str, str]]]],
    prompts: Sequence[str],
    rate: float,
    duration: float,
    stream: bool,
    order: int = 0,
) -> tuple[dict[str, list[float]], int]:
    """Every path at `rate`, interleaved request by request (so all see the same machine load), each round of one
    request per path in a fresh random order (`order` seeds it). A fixed cyclic order (rotated per repeat, as
    before 2026-12-04) had each path always sent right after the same other path: two identical floors then
    differed by 8-21% by position alone, the first floor (sent after Envoy alone, the lightest path) the faster.
    A path's header sets are used in turn (Envoy alone: one destination per simulator)."""
    lat: dict[str, list[float]] = {k: [] for k in paths}
    errors = 0
    rng = random.Random(order)
    names = list(paths)
    sent = dict.fromkeys(names, 0)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=512)) as session:

        async def one(kind: str, prompt: str) -> None:
            nonlocal errors
            url, header_sets = paths[kind]
            headers = header_sets[sent[kind] % len(header_sets)]
            sent[kind] += 1
            body = {"model": MODEL, "prompt": prompt, "max_tokens": 16 if stream else 1, "stream": stream}
            t0 = time.perf_counter()
            try:
                async with session.post(url + "/v1/completions", json=body, headers=headers) as r:
                    await r.read()
                    if r.status != 200:
                        errors += 1
                        return
            except aiohttp.ClientError:
                errors += 1
                return
            lat[kind].append(time.perf_counter() - t0)

        tasks = []
        start = time.perf_counter()
        for i, kind in enumerate(interleaved(names, int(rate * duration), rng)):
            delay = start + i / (rate * len(names)) - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(kind, rng.choice(prompts))))
        await asyncio.gather(*tasks)
    return lat, errors


SIM_ARGS = [
    "--prefill-overhead",
    "0",
    "--prefill-time-per-token",
    "0",
    "--inter-token-latency",
    "0",
    "--num-gpu-blocks",
    "65536",
    "--max-num-seqs",
    "256",
    "--max-model-len",
    "65536",
]


def part2(
    points: list[tuple[int, list[float]]],
    duration: float,
    chains: Sequence[str],
    n_sims: int = 4,
    repeats: int = 1,
    responses: Sequence[bool] = (False, True),
    variants: Sequence[tuple[str, list[str], Path | None]] = (),
    floor_uvloop: bool = False,
    shared_pool: bool = False,
    response_path: bool = True,
) -> list[dict[str, Any]]:
    """Each point runs `repeats` times (paths interleaved in a random order per round); per path the median over
    the repeats of its p50/p99 is reported, and ours/floor is the median of the per-repeat ratios of added p50.
    `variants` adds, per chain, an EPP started with extra `epp serve` flags (an A/B of a flag in the same run).

    Every path has a pool of `n_sims` simulators of its own, so an EPP ingests the KV events of the requests it
    routed, as one replica in front of its pool does; with `shared_pool` all paths share one pool and each EPP also
    ingests the events of every other path's requests. `response_path` False: every Envoy's ext_proc filter sends no
    response messages (routing only), the floor's and the EPPs' alike."""
    n_epps = len(chains) * (1 + len(variants))
    with contextlib.ExitStack() as pools:
        tmp = pools.enter_context(tempfile.TemporaryDirectory(prefix="pyepp-breakdown-"))
        sims = pools.enter_context(start_simulators(n_sims, base_args=SIM_ARGS))
        # Envoy alone's pool, each floor's, each EPP's: every pool serves one path's requests
        own = [
            sims if shared_pool else pools.enter_context(start_simulators(n_sims, base_args=SIM_ARGS))
            for _ in range(1 + int(floor_uvloop) + n_epps)
        ]
        return _part2_run(
            Path(tmp), sims, own, points, duration, chains, repeats, responses, variants, floor_uvloop, response_path
        )


def _part2_run(
    work: Path,
    sims: list[Any],
    pools: list[list[Any]],
    points: list[tuple[int, list[float]]],
    duration: float,
    chains: Sequence[str],
    repeats: int,
    responses: Sequence[bool],
    variants: Sequence[tuple[str, list[str], Path | None]],
    floor_uvloop: bool,
    response_path: bool = True,
) -> list[dict[str, Any]]:
    """`sims` serves Envoy alone; `pools` the floor, the uvloop floor if any, then each EPP."""
    texts = TextFactory(3)
    rows: list[dict[str, Any]] = []
    n_sims = len(sims)
    stacks: list[Any] = []
    floor = FloorProcess(work, ",".join(s.hostport for s in pools[0]))
    envoy_floor: EnvoyProcess | None = None
    # The same floor on uvloop (`--floor-uvloop`): the EPP serves on uvloop when it is installed.
    floor_uv = FloorProcess(work, ",".join(s.hostport for s in pools[1]), "uvloop") if floor_uvloop else None
    epp_pools = pools[1 + int(floor_uvloop) :]
    envoy_floor_uv: EnvoyProcess | None = None
    try:
        names = []
        for chain in chains:
            for i, (variant, extra, tree) in enumerate([("", [], None), *variants]):
                d = work / f"{chain}-{i}"
                d.mkdir()
                names.append(f"epp {chain} {variant}".rstrip())
                stacks.append(
                    start_stack(
                        d,
                        backends=[],
                        config=config_text(chain, epp_pools[len(stacks)]),
                        epp_args=["--log-level", "warning", *extra],
                        envoy_overrides={"direct_port": free_port(), "response_path": response_path},
                        epp_source=tree,
                        ready_timeout=120.0,
                    )
                )
        envoy_floor = floor.envoy_in_front(work, response_path)
        direct = f"http://127.0.0.1:{stacks[0].envoy.opts.direct_port}"
        paths: dict[str, tuple[str, list[dict[str, str]]]] = {
            "envoy alone": (direct, [{DEST: s.hostport} for s in sims]),
            "python floor": (envoy_floor.url, [{}]),
        }
        pids = {"python floor": floor.proc.pid}
        if floor_uv is not None:
            envoy_floor_uv = floor_uv.envoy_in_front(work, response_path)
            paths["python floor uvloop"] = (envoy_floor_uv.url, [{}])
            pids["python floor uvloop"] = floor_uv.proc.pid
        for name, st in zip(names, stacks, strict=True):
            paths[name] = (st.url, [{}])
            pids[name] = st.epp.proc.pid
        print(
            f"\n# part 2: through Envoy, ms (added = path − envoy alone); {n_sims} simulators, {duration:.0f} s "
            f"per point, median of {repeats} alternated repeats"
        )
        print(
            f"{'tokens':>6}{'rate':>6}{'resp':>6}  {'path':24}{'p50':>8}{'p99':>8}{'+p50':>8}{'+p99':>8}"
            f"{'vs floor p50':>14}{'ratios':>24}{'CPU µs/req':>12}"
        )
        for size, rates in points:
            prefix = texts.text(("prefix", size), size // 2)
            prompts = [prefix + texts.text(("q", size, i), size - size // 2) for i in range(8)]
            for stream in responses:
                asyncio.run(_measure(paths, prompts, 5, 1.0, stream))  # warm up
                for rate in rates:
                    runs: list[dict[str, tuple[float, float]]] = []
                    cpu: dict[str, list[float]] = {k: [] for k in pids}
                    err = 0
                    # Every part's share of the 2 cores while a point runs (is the box, not the EPP, the limit?)
                    groups = {
                        "simulators": sorted({x.proc.pid for pool in [sims, *pools] for x in pool}),
                        "envoys": [envoy_floor.proc.pid, *(st.envoy.proc.pid for st in stacks)]
                        + ([envoy_floor_uv.proc.pid] if envoy_floor_uv is not None else []),
                        "epps": [st.epp.proc.pid for st in stacks],
                        "floor": [floor.proc.pid] + ([floor_uv.proc.pid] if floor_uv is not None else []),
                        "client": [os.getpid()],
                    }
                    share: dict[str, list[float]] = {g: [] for g in groups}
                    for r in range(repeats):
                        c0 = {k: cpu_seconds(pid) for k, pid in pids.items()}
                        g0 = {g: sum(cpu_seconds(p) for p in ps) for g, ps in groups.items()}
                        t0 = time.monotonic()
                        lat, e = asyncio.run(_measure(paths, prompts, rate, duration, stream, order=r))
                        dt = time.monotonic() - t0
                        for k, pid in pids.items():  # the server process's CPU (idle work included) per request
                            cpu[k].append((cpu_seconds(pid) - c0[k]) / max(1, len(lat[k])) * 1e6)
                        for g, ps in groups.items():
                            share[g].append((sum(cpu_seconds(p) for p in ps) - g0[g]) / dt * 100)
                        err += e
                        runs.append({k: (percentile(v, 0.5) * 1e3, percentile(v, 0.99) * 1e3) for k, v in lat.items()})
                    rows.extend(_summarize(size, rate, stream, runs, err, cpu))
                    load = os.getloadavg()[0]
                    print(
                        "  CPU, % of one core (median of repeats): "
                        + ", ".join(f"{g} {statistics.median(v):.0f}%" for g, v in share.items())
                        + f"; load average {load:.1f}",
                        flush=True,
                    )
                    rows.append({"tokens": size, "rate": rate, "sse": stream, "cpu_share": share, "load": load})
                    if err:
                        print(f"  ({err} errors)")
    finally:
        if envoy_floor is not None:
            envoy_floor.stop()
        floor.stop()
        if envoy_floor_uv is not None:
            envoy_floor_uv.stop()
        if floor_uv is not None:
            floor_uv.stop()
        for st in stacks:
            st.close()
    return rows


def _summarize(
    size: int,
    rate: float,
    stream: bool,
    runs: list[dict[str, tuple[float, float]]],
    errors: int,
    cpu: dict[str, list[float]] | None = None,
) -> list[dict[str, Any]]:
    rows = []
    med = statistics.median
    for name in runs[0]:
        added50 = [r[name][0] - r["envoy alone"][0] for r in runs]
        added99 = [r[name][1] - r["envoy alone"][1] for r in runs]
        floor50 = [r["python floor"][0] - r["envoy alone"][0] for r in runs]
        ratios = [a / f for a, f in zip(added50, floor50, strict=True) if f > 0] if name.startswith("epp") else []
        uv = "python floor uvloop"
        uv50 = [r[uv][0] - r["envoy alone"][0] for r in runs] if uv in runs[0] else []
        uv_ratios = []
        if uv50 and name.startswith("epp"):
            uv_ratios = [a / f for a, f in zip(added50, uv50, strict=True) if f > 0]
        row = {
            "tokens": size,
            "rate": rate,
            "sse": stream,
            "path": name,
            "p50_ms": med(r[name][0] for r in runs),
            "p99_ms": med(r[name][1] for r in runs),
            "added_p50_ms": med(added50),
            "added_p99_ms": med(added99),
            "vs_floor_p50": med(ratios) if ratios else None,
            "vs_floor_p50_runs": ratios,
            "vs_floor_uvloop_p50": med(uv_ratios) if uv_ratios else None,
            "vs_floor_uvloop_p50_runs": uv_ratios,
            "errors": errors,
            "cpu_us_per_request": med((cpu or {}).get(name) or [float("nan")]),
        }
        rows.append(row)
        vs = row["vs_floor_p50"]
        print(
            f"{size:>6}{rate:>6.0f}{'sse' if stream else 'json':>6}  {name:24}"
            f"{row['p50_ms']:>8.2f}{row['p99_ms']:>8.2f}{row['added_p50_ms']:>8.2f}{row['added_p99_ms']:>8.2f}"
            f"{(f'{vs:.2f}x' if vs is not None else ''):>14}{' '.join(f'{x:.2f}' for x in ratios):>24}"
            f"{row['cpu_us_per_request']:>12.0f}" + (f"   vs uvloop floor {med(uv_ratios):.2f}x" if uv_ratios else ""),
            flush=True,
        )
    return rows


# -- part 3: ext_proc over gRPC, no Envoy ---------------------------------------------------------------------


async def _grpc_one(
    stub: Any, req: list[pb.ProcessingRequest], resp: list[pb.ProcessingRequest]
) -> tuple[float, float]:
    """One request as Envoy sends it (FULL_DUPLEX_STREAMED): (request phase, response phase) in seconds."""
    call = stub.Process()
    t0 = time.perf_counter()
    for m in req:
        await call.write(m)
    await call.read()  # the headers response (destination)
    await call.read()  # the streamed body
    t1 = time.perf_counter()
    for m in resp:
        await call.write(m)
        await call.read()
    t2 = time.perf_counter()
    await call.done_writing()
    await call.read()
    return t1 - t0, t2 - t1


async def _grpc_ab(ports: dict[str, int], n: int, stream: bool, prompts: Sequence[str]) -> dict[str, Any]:
    import grpc
    from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

    reqs = [[pb.ProcessingRequest.FromString(w) for w in request_wire(p, stream)] for p in prompts]
    resp = [pb.ProcessingRequest.FromString(w) for w in response_wire(stream)]
    chans = {k: grpc.aio.insecure_channel(f"127.0.0.1:{p}") for k, p in ports.items()}
    stubs = {k: pb_grpc.ExternalProcessorStub(c) for k, c in chans.items()}
    for stub in stubs.values():  # warm up (connections, the tokenizer's cache)
        for i in range(30):
            await _grpc_one(stub, reqs[i % len(reqs)], resp)
    res: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in stubs}
    names = list(stubs)
    for i in range(n):
        for k in names if i % 2 else names[::-1]:  # alternated, one request at a time
            a, b = await _grpc_one(stubs[k], reqs[i % len(reqs)], resp)
            res[k][0].append(a)
            res[k][1].append(b)
            await asyncio.sleep(0.002)
    for c in chans.values():
        await c.close()
    med = statistics.median
    return {
        k: {"request_ms": med(a) * 1e3, "response_ms": med(b) * 1e3, "messages": len(resp)} for k, (a, b) in res.items()
    }


def part3(
    chain: str,
    n: int,
    n_sims: int,
    epp_args: Sequence[str],
    responses: Sequence[bool],
    variants: Sequence[tuple[str, list[str], Path | None]] = (),
) -> list[dict[str, Any]]:
    """Sequential requests straight to the EPP's and the floor's gRPC ports (what Envoy would send), alternated:
    the transport and the server without Envoy, so the difference is what the EPP process adds per message.
    `variants` adds EPPs (other flags or another checkout) to the same alternation."""
    from e2e.harness.procs import EppPorts, EppProcess

    texts = TextFactory(3)
    prefix = texts.text(("prefix", 1024), 512)
    prompts = [prefix + texts.text(("q", 1024, i), 512) for i in range(8)]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="pyepp-grpc-") as tmp, start_simulators(n_sims, base_args=SIM_ARGS) as sims:
        work = Path(tmp)
        cfg = work / "epp.yaml"
        cfg.write_text(config_text(chain, sims))
        epps = {
            ("epp " + name).rstrip(): EppProcess(
                cfg, work, EppPorts(*free_ports(3)), log_level="warning", extra_args=[*epp_args, *extra],
                source_tree=tree,
            )
            for name, extra, tree in [("", [], None), *variants]
        }  # fmt: skip
        floor = FloorProcess(work, ",".join(s.hostport for s in sims))
        try:
            for e in epps.values():
                e.wait_ready()
            floor.wait_ready()
            print(f"\n# part 3: ext_proc over gRPC without Envoy, {chain}, epp args {list(epp_args)}; median ms")
            for stream in responses:
                ports = {k: e.ports.grpc for k, e in epps.items()} | {"floor": floor.port}
                r = asyncio.run(_grpc_ab(ports, n, stream, prompts))
                f = r["floor"]
                for name in epps:
                    e = r[name]
                    row = {"chain": chain, "sse": stream, "epp_args": list(epp_args), "variant": name, **r}
                    rows.append(row)
                    print(
                        f"{'sse' if stream else 'json':>5}  {name:16} request phase {e['request_ms']:.3f} floor "
                        f"{f['request_ms']:.3f} (+{e['request_ms'] - f['request_ms']:.3f});  response phase "
                        f"({e['messages']} msgs) {e['response_ms']:.3f} floor {f['response_ms']:.3f} "
                        f"(+{e['response_ms'] - f['response_ms']:.3f})",
                        flush=True,
                    )
        finally:
            for e in epps.values():
                e.stop()
            floor.stop()
    return rows


# -- part 4: what the EPP process burns with no request at all -------------------------------------------------


def part4(
    chain: str, seconds: float, repeats: int, n_sims: int, variants: Sequence[tuple[str, list[str], Path | None]]
) -> Any:
    """Idle CPU (% of one core) of the EPP with each variant's flags and of the floor, all up at once next to the
    same simulators: background work (scrapes, KV-event subscriptions, gauges) that competes with serving."""
    from e2e.harness.procs import EppPorts, EppProcess

    rows: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="pyepp-idle-") as tmp, start_simulators(n_sims, base_args=SIM_ARGS) as sims:
        work = Path(tmp)
        cfg = work / "epp.yaml"
        cfg.write_text(config_text(chain, sims))
        procs: dict[str, Any] = {}
        try:
            for name, extra, tree in [("", [], None), *variants]:
                procs[f"epp {chain} {name}".rstrip()] = EppProcess(
                    cfg, work, EppPorts(*free_ports(3)), log_level="warning", extra_args=list(extra), source_tree=tree
                )
            procs["python floor"] = FloorProcess(work, ",".join(s.hostport for s in sims))
            for p in procs.values():
                p.wait_ready(60)
            time.sleep(3.0)
            for _ in range(repeats):
                before = {k: cpu_seconds(p.proc.pid) for k, p in procs.items()}
                t0 = time.monotonic()
                time.sleep(seconds)
                dt = time.monotonic() - t0
                for k, p in procs.items():
                    rows.setdefault(k, []).append((cpu_seconds(p.proc.pid) - before[k]) / dt * 100)
        finally:
            for p in procs.values():
                p.stop()
    print(f"\n# part 4: idle CPU, % of one core, {n_sims} simulators, {repeats} x {seconds:.0f} s")
    for k, v in rows.items():
        print(f"  {k:32} median {statistics.median(v):6.2f}%   ({' '.join(f'{x:.2f}' for x in v)})")
    return rows


def _variant(spec: str) -> tuple[str, list[str], Path | None]:
    """`name[@/path/to/checkout]=flags` → (name, flags, checkout)."""
    head, _, flags = spec.partition("=")
    name, _, tree = head.partition("@")
    if tree and not (Path(tree) / "epp" / "__init__.py").exists():
        raise SystemExit(f"--variants {spec!r}: {tree} holds no epp package")
    return name, flags.split(), Path(tree) if tree else None


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m e2e.bench.cost.breakdown")
    p.add_argument("--part", choices=("1", "2", "3", "4", "all"), default="all")
    p.add_argument("-n", type=int, default=200, help="part 1: requests per repeat")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--points", default="1024:10,50;8192:10", help="part 2: prompt tokens:rates per path")
    p.add_argument("--duration", type=float, default=8.0)
    p.add_argument("--chains", default="approximate,precise")
    p.add_argument("--sims", type=int, default=4, help="part 2: simulators in the pool (one saturates at 50/s)")
    p.add_argument(
        "--shared-pool",
        action="store_true",
        help="part 2: one simulator pool for every path (before 2026-12-04; each EPP then also ingests the KV "
        "events of the other paths' requests); default: a pool per EPP, one for Envoy alone and the floors",
    )
    p.add_argument("--repeats2", type=int, default=3, help="part 2: alternated repeats per point")
    p.add_argument("--responses", default="json,sse", help="part 2/3: json, sse or both")
    p.add_argument("-n3", type=int, default=300, help="part 3: requests per server")
    p.add_argument("--epp-args", default="", help="part 3: extra `epp serve` flags")
    p.add_argument(
        "--variants",
        default="",
        help="part 2/3/4: extra EPPs per chain, 'name[@checkout]=flags;...' (e.g. 'scrape10s=--refresh-metrics-"
        "interval 10s' or 'main@/tmp/main-tree=': another commit's EPP)",
    )
    p.add_argument(
        "--floor-uvloop",
        action="store_true",
        help="part 2: also run the floor on uvloop (the EPP's loop when installed); ratios to it in vs_floor_uvloop",
    )
    p.add_argument(
        "--no-response-path",
        action="store_true",
        help="part 2: Envoy sends no response messages to the ext_proc servers (routing only; no usage or TTFT)",
    )
    p.add_argument("--clock", choices=("cpu", "wall"), default="cpu", help="part 1: process CPU time or wall time")
    p.add_argument("--json", help="write the rows here")
    ns = p.parse_args(argv)
    global CLOCK
    CLOCK = time.process_time if ns.clock == "cpu" else time.perf_counter
    out: dict[str, Any] = {}
    if ns.part in ("1", "all"):
        out["part1"] = part1(ns.n, ns.repeats)
        print_part1(out["part1"])
    variants = [_variant(v) for v in ns.variants.split(";") if v]
    if ns.part in ("2", "all"):
        points = [
            (int(s), [float(r) for r in rs.split(",")]) for s, rs in (pt.split(":") for pt in ns.points.split(";"))
        ]
        responses = [r == "sse" for r in ns.responses.split(",")]
        out["part2"] = part2(
            points,
            ns.duration,
            ns.chains.split(","),
            ns.sims,
            ns.repeats2,
            responses,
            variants,
            ns.floor_uvloop,
            ns.shared_pool,
            not ns.no_response_path,
        )
    if ns.part == "3":
        responses = [r == "sse" for r in ns.responses.split(",")]
        out["part3"] = [
            row
            for chain in ns.chains.split(",")
            for row in part3(chain, ns.n3, ns.sims, ns.epp_args.split(), responses, variants)
        ]
    if ns.part == "4":
        out["part4"] = part4(ns.chains.split(",")[0], ns.duration, ns.repeats2, ns.sims, variants)
    if ns.json:
        Path(ns.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
