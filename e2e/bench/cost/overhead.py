"""Latency the EPP adds: client → Envoy+EPP → simulator vs client → Envoy → simulator, side by side.

One Envoy has two listeners: the gateway (ext_proc → our EPP → ORIGINAL_DST) and a `direct` listener
without ext_proc, where the client names the simulator in `x-gateway-destination-endpoint` itself. The
simulator answers at once (no modelled latency), requests alternate between the two listeners at the same
open-loop rate, so both paths see the same machine load. Reported per (strategy, prompt size, rate):
p50/p99 of each path, the added latency (gateway − direct) and the ext_proc server's CPU per gateway request (its
process and children, from /proc, over the measured window: background work such as scrapes included), and that
less its idle CPU (measured for `--idle` seconds with no requests before the points).

Strategy `floor` is the Python floor (`e2e.bench.cost.floor`: fixed destination, no parsing) behind the same Envoy;
`--external NAME=SPEC.yaml` makes strategy NAME another EPP started from the spec's command line
(`e2e.harness.external`, specs in `e2e/external/`), over the same simulator.

    python -m e2e.bench.cost.overhead                # 1k/8k/32k-token prompts at two rates each, approximate + precise
    python -m e2e.bench.cost.overhead --points "1024:20" --duration 5
    LLMD_EPP=/path/to/epp python -m e2e.bench.cost.overhead --points 1024:50 --strategies \
        llm-d-default,pyepp-default,floor --external llm-d-default=e2e/external/llm-d-default.yaml
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import shlex
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from e2e.bench.cost.breakdown import FloorProcess
from e2e.bench.loadgen import percentile
from e2e.bench.procstat import cpu_seconds
from e2e.harness.external import ExternalEpp, checked_externals, pool_values
from e2e.harness.ports import free_port
from e2e.harness.stack import start_stack
from e2e.sim.launch import SimProcess, start_simulators
from e2e.strategies import config_text, endpoints_yaml
from e2e.workloads.text import TextFactory

DEST = "x-gateway-destination-endpoint"
MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
FLOOR = "floor"


@dataclass(frozen=True)
class Gateway:
    """One strategy's gateway: Envoy's ext_proc listener, its direct listener, the ext_proc server's pid."""

    gateway: str
    direct: str
    pid: int


@contextlib.contextmanager
def start_gateway(strategy: str, work: Path, sim: SimProcess, externals: dict[str, ExternalEpp],
            response_mode: str | None, epp_args: Sequence[str] = ()) -> Iterator[Gateway]:  # fmt: skip
    """Envoy (with a direct listener) in front of `strategy`'s ext_proc server: ours, the floor or an external EPP."""
    direct_port = free_port()
    if strategy == FLOOR:
        floor = FloorProcess(work, sim.hostport)
        try:
            envoy = floor.envoy_in_front(work, overrides={"direct_port": direct_port,
                                                          "response_body_mode": response_mode})  # fmt: skip
            try:
                yield Gateway(envoy.url, f"http://127.0.0.1:{direct_port}", floor.proc.pid)
            finally:
                envoy.stop()
        finally:
            floor.stop()
        return
    overrides = {"direct_port": direct_port}
    if strategy in externals:
        spec = externals[strategy]
        values = pool_values([sim], work, endpoints=endpoints_yaml([sim]), block_size=16, prefill_tps=15928.0,
                             model=MODEL, render_url=sim.url)  # fmt: skip
        stack = start_stack(work, backends=[], config=spec.config_text(values), external=spec, external_values=values,
                            envoy_overrides=overrides, response_mode=response_mode)  # fmt: skip
    else:
        stack = start_stack(
            work, backends=[], config=config_text(strategy, [sim]), epp_args=["--log-level", "warning", *epp_args],
            envoy_overrides=overrides, response_mode=response_mode,
        )  # fmt: skip
    try:
        yield Gateway(stack.url, f"http://127.0.0.1:{direct_port}", stack.epp.proc.pid)
    finally:
        stack.close()


def wait_routing(url: str, within: float = 60.0) -> None:
    """Returns once a request through the gateway is answered 200 (an external EPP may listen before it has found
    its pods)."""
    deadline = time.monotonic() + within

    async def once() -> int:
        async with aiohttp.ClientSession() as session:
            body = {"model": MODEL, "prompt": "warm up", "max_tokens": 1}
            async with session.post(url + "/v1/completions", json=body) as r:
                await r.read()
                return r.status

    while True:
        try:
            status = asyncio.run(once())
        except aiohttp.ClientError as e:
            status, why = 0, str(e)
        else:
            why = f"HTTP {status}"
        if status == 200:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url}: no request routed within {within:.0f} s ({why})")
        time.sleep(0.5)


async def _measure(
    gateway: str, direct: str, dest: str, prompts: Sequence[str], rate: float, duration: float, model: str
) -> tuple[list[float], list[float], int]:
    lat: dict[str, list[float]] = {"gw": [], "direct": []}
    errors = 0
    rng = random.Random(0)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256)) as session:

        async def one(kind: str, prompt: str) -> None:
            nonlocal errors
            url = (gateway if kind == "gw" else direct) + "/v1/completions"
            headers = {DEST: dest} if kind == "direct" else {}
            body = {"model": model, "prompt": prompt, "max_tokens": 1}
            t0 = time.perf_counter()
            async with session.post(url, json=body, headers=headers) as r:
                await r.read()
                if r.status != 200:
                    errors += 1
                    return
            lat[kind].append(time.perf_counter() - t0)

        tasks = []
        start = time.perf_counter()
        n = int(rate * duration)
        for i in range(2 * n):  # both paths at `rate` each, interleaved
            t = i / (2 * rate)
            delay = start + t - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one("gw" if i % 2 == 0 else "direct", rng.choice(prompts))))
        await asyncio.gather(*tasks)
    return lat["gw"], lat["direct"], errors


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m e2e.bench.cost.overhead")
    p.add_argument(
        "--points",
        default="1024:10,50;8192:5,20;32768:2,5",
        help="prompt tokens:rates per path; the simulator tokenizes every prompt, so big prompts get lower rates",
    )
    p.add_argument("--duration", type=float, default=8.0, help="seconds per point")
    p.add_argument(
        "--strategies",
        default="approximate,precise",
        help=f"ours, {FLOOR!r} or an --external name; one named twice runs twice (alternate them for medians)",
    )
    p.add_argument("--external", default="", help="name=spec.yaml,...: strategy <name> is another EPP from its "
                   "command line (e2e/external/)")  # fmt: skip
    p.add_argument("--response-mode", default=None, help="Envoy response_body_mode, e.g. NONE (no usage metrics)")
    p.add_argument("--idle", type=float, default=3.0, help="seconds of idle CPU measured per strategy")
    p.add_argument("--epp-args", default="", help="extra `epp serve` flags for ours (e.g. '--event-loop asyncio')")
    p.add_argument("--json", help="write the rows here")
    ns = p.parse_args(argv)
    try:
        externals = checked_externals(ns.external)
    except (ValueError, OSError) as e:
        p.error(str(e))
    points = [
        (int(size), [float(r) for r in rates.split(",")])
        for size, rates in (pt.split(":") for pt in ns.points.split(";"))
    ]
    texts = TextFactory(3)
    rows: list[dict[str, object]] = []
    sim_args = ["--prefill-overhead", "0", "--prefill-time-per-token", "0", "--inter-token-latency", "0",
                "--num-gpu-blocks", "65536", "--max-num-seqs", "256", "--max-model-len", "65536"]  # fmt: skip
    print(f"{'strategy':<16}{'tokens':>7}{'rate':>6}{'gw p50':>9}{'gw p99':>9}{'dir p50':>9}{'dir p99':>9}"
          f"{'+p50':>8}{'+p99':>8}{'CPU µs':>8}{'net µs':>8}{'idle ms/s':>10}{'err':>5}")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="pyepp-overhead-") as tmp, start_simulators(1, base_args=sim_args) as sims:
        sim = sims[0]
        for i, strategy in enumerate(ns.strategies.split(",")):
            work = Path(tmp) / f"{i}-{strategy}"
            work.mkdir()
            with start_gateway(strategy, work, sim, externals, ns.response_mode, shlex.split(ns.epp_args)) as gw_path:
                wait_routing(gw_path.gateway)
                time.sleep(1.0)
                cpu0 = cpu_seconds(gw_path.pid, children=True)
                time.sleep(ns.idle)
                idle = (cpu_seconds(gw_path.pid, children=True) - cpu0) / ns.idle  # CPU seconds a second
                for size, rates in points:
                    # 8 prompts per size sharing a prefix, like a real workload (the prefix scorers have work to do)
                    prefix = texts.text(("prefix", size), size // 2)
                    prompts = [prefix + texts.text(("q", size, i), size - size // 2) for i in range(8)]
                    asyncio.run(_measure(gw_path.gateway, gw_path.direct, sim.hostport, prompts, 5, 1.0, MODEL))
                    for rate in rates:
                        cpu0 = cpu_seconds(gw_path.pid, children=True)
                        gw, dr, err = asyncio.run(
                            _measure(gw_path.gateway, gw_path.direct, sim.hostport, prompts, rate, ns.duration, MODEL)
                        )
                        cpu = cpu_seconds(gw_path.pid, children=True) - cpu0
                        sent = int(rate * ns.duration)
                        row = {
                            "strategy": strategy, "tokens": size, "rate": rate,
                            "gw_p50_ms": percentile(gw, 0.5) * 1e3, "gw_p99_ms": percentile(gw, 0.99) * 1e3,
                            "direct_p50_ms": percentile(dr, 0.5) * 1e3, "direct_p99_ms": percentile(dr, 0.99) * 1e3,
                            "errors": err, "n": len(gw) + len(dr),
                            "cpu_us_per_request": cpu / sent * 1e6, "idle_cpu_ms_per_s": idle * 1e3,
                            "cpu_net_us_per_request": (cpu - idle * ns.duration) / sent * 1e6,
                        }  # fmt: skip
                        row["added_p50_ms"] = row["gw_p50_ms"] - row["direct_p50_ms"]
                        row["added_p99_ms"] = row["gw_p99_ms"] - row["direct_p99_ms"]
                        rows.append(row)
                        print(f"{strategy:<16}{size:>7}{rate:>6.0f}{row['gw_p50_ms']:>9.2f}{row['gw_p99_ms']:>9.2f}"
                              f"{row['direct_p50_ms']:>9.2f}{row['direct_p99_ms']:>9.2f}{row['added_p50_ms']:>8.2f}"
                              f"{row['added_p99_ms']:>8.2f}{row['cpu_us_per_request']:>8.0f}{row['cpu_net_us_per_request']:>8.0f}"
                              f"{row['idle_cpu_ms_per_s']:>10.1f}{err:>5}",
                              flush=True)  # fmt: skip
    if ns.json:
        Path(ns.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
