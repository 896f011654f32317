"""What streaming through the EPP costs: every SSE chunk of a response passes through ext_proc (FULL_DUPLEX_STREAMED,
for usage and the model-name rewrite). N concurrent streams go through the gateway listener (Envoy + EPP) and the
same number through a `direct` listener of the same Envoy without ext_proc, at the same time, to one simulator
that streams a token every `--itl` seconds. Reported per concurrency: inter-chunk gap p50/p99 seen by the client
on each path, the added gap, and chunks/s per path.

    python -m e2e.bench.cost.streaming --concurrency 50,200 --tokens 200 --itl 0.01 [--sims 4] [--repeats 3]

A third path (on by default) runs the same streams through a second Envoy whose ext_proc is the Python floor
(`cost.floor`: same protos and message sequence, no work): gateway − floor is what the EPP itself adds per chunk,
floor − direct what any Python ext_proc server adds. `--sims N` spreads the streams over N simulators (round-robin
on the direct and floor paths, the EPP's own picks on the gateway) so that one simulator is not the ceiling.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

from e2e.bench.cost.breakdown import FloorProcess
from e2e.bench.loadgen import percentile
from e2e.bench.procstat import cpu_seconds
from e2e.harness.envoy_config import DESTINATION_HEADER as DEST
from e2e.harness.ports import free_port
from e2e.harness.procs import EnvoyProcess
from e2e.harness.stack import start_stack
from e2e.sim.launch import start_simulators
from e2e.strategies import config_text

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"


async def _stream(session: aiohttp.ClientSession, url: str, headers: dict[str, str], tokens: int) -> list[float]:
    body = {"model": MODEL, "prompt": "Tell me a story.", "max_tokens": tokens, "stream": True, "ignore_eos": True}
    gaps: list[float] = []
    async with session.post(url + "/v1/completions", json=body, headers=headers) as r:
        if r.status != 200:
            return []
        last = None
        async for _ in r.content.iter_any():
            now = time.perf_counter()
            if last is not None:
                gaps.append(now - last)
            last = now
    return gaps


def _idle_rate(pid: int, seconds: float = 2.0) -> float:
    """CPU s per s the process spends with no request (the EPP's scrapes, timers): subtracted from the run's."""
    c0 = cpu_seconds(pid)
    time.sleep(seconds)
    return (cpu_seconds(pid) - c0) / seconds


async def _measure(
    paths: dict[str, tuple[str, list[dict[str, str]]]], n: int, tokens: int, pids: dict[str, int] | None = None
) -> dict[str, Any]:
    """`n` streams on every path at once; a path's header sets are used in turn (direct: one per simulator).
    With `pids` (path -> its ext_proc server's pid): that server's CPU per chunk, its idle rate subtracted."""
    idle = {name: _idle_rate(pid) for name, pid in (pids or {}).items()}
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=600)) as s:
        cpu0 = {name: cpu_seconds(pid) for name, pid in (pids or {}).items()}
        t0 = time.perf_counter()
        tasks = [_stream(s, url, hs[i % len(hs)], tokens) for url, hs in paths.values() for i in range(n)]
        res = await asyncio.gather(*tasks)
        wall = time.perf_counter() - t0
        raw = {name: cpu_seconds(pid) - cpu0[name] for name, pid in (pids or {}).items()}
        cpu = {name: raw[name] - idle[name] * wall for name in raw}
    row: dict[str, Any] = {"concurrency": n}
    for k, name in enumerate(paths):
        mine = res[k * n : (k + 1) * n]
        gaps = [x for r in mine for x in r]
        row[name] = {
            "p50_ms": percentile(gaps, 0.5) * 1e3, "p99_ms": percentile(gaps, 0.99) * 1e3,
            "chunks_per_s": len(gaps) / wall, "failed": sum(1 for r in mine if not r),
        }  # fmt: skip
        if name in cpu:  # chunks = gaps + the first chunk of each stream
            chunks = max(1, len(gaps) + len(mine))
            row[name]["cpu_us_per_chunk"] = cpu[name] / chunks * 1e6
            row[name]["cpu_raw_us_per_chunk"] = raw[name] / chunks * 1e6  # idle rate not subtracted
            row[name]["idle_cpu_share"] = idle[name]
    return row


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m e2e.bench.cost.streaming")
    p.add_argument("--concurrency", default="50,200")
    p.add_argument("--tokens", type=int, default=200, help="tokens per stream")
    p.add_argument("--itl", type=float, default=0.01, help="the simulator's inter-token latency (s)")
    p.add_argument("--strategy", default="approximate")
    p.add_argument("--sims", type=int, default=1, help="simulators in the pool (one saturates near 1,000 chunks/s)")
    p.add_argument("--floor", action=argparse.BooleanOptionalAction, default=True,
                   help="a third path: Envoy + the Python floor (e2e/bench/cost/floor.py)")  # fmt: skip
    p.add_argument("--repeats", type=int, default=1, help="runs per concurrency (medians reported)")
    p.add_argument("--json", help="write the rows here")
    ns = p.parse_args(argv)
    sim_args = ["--prefill-overhead", "0", "--prefill-time-per-token", "0", "--inter-token-latency", str(ns.itl),
                "--num-gpu-blocks", "65536", "--max-num-seqs", "1024"]  # fmt: skip
    rows = []
    with (
        tempfile.TemporaryDirectory(prefix="pyepp-stream-") as tmp,
        start_simulators(ns.sims, base_args=sim_args) as sims,
    ):
        work = Path(tmp)
        stack = start_stack(
            work, backends=[], config=config_text(ns.strategy, sims), epp_args=["--log-level", "warning"],
            envoy_overrides={"direct_port": free_port()},
        )  # fmt: skip
        floor: FloorProcess | None = None
        envoy_floor: EnvoyProcess | None = None
        try:
            paths: dict[str, tuple[str, list[dict[str, str]]]] = {
                "gateway": (stack.url, [{}]),
                "direct": (f"http://127.0.0.1:{stack.envoy.opts.direct_port}", [{DEST: s.hostport} for s in sims]),
            }
            if ns.floor:
                floor = FloorProcess(work, ",".join(s.hostport for s in sims))
                envoy_floor = floor.envoy_in_front(work)
                paths["floor"] = (envoy_floor.url, [{}])
            pids = {"gateway": stack.epp.proc.pid}
            if floor is not None:
                pids["floor"] = floor.proc.pid
            asyncio.run(_measure(paths, 4, 10))  # warm up (tokenizer, connections)
            print(f"per-chunk gap (ms) seen by the client; {len(sims)} simulator(s), {ns.repeats} run(s) per point;"
                  " cpu = the path's ext_proc server's CPU per chunk (its idle rate subtracted; raw: not subtracted;"
                  " its share of each stream's request path included)")  # fmt: skip
            print(f"{'streams':>8}{'path':>9}{'p50':>9}{'p99':>9}{'+p50':>8}{'+p99':>8}{'chunks/s':>10}{'failed':>7}"
                  f"{'cpu us':>8}{'raw us':>8}")  # fmt: skip
            for n in (int(c) for c in ns.concurrency.split(",")):
                runs = [asyncio.run(_measure(paths, n, ns.tokens, pids)) for _ in range(ns.repeats)]
                row: dict[str, Any] = {"concurrency": n, "runs": runs}
                for name in paths:
                    med = {k: statistics.median(r[name][k] for r in runs) for k in runs[0][name]}
                    med["added_p50_ms"] = statistics.median(r[name]["p50_ms"] - r["direct"]["p50_ms"] for r in runs)
                    med["added_p99_ms"] = statistics.median(r[name]["p99_ms"] - r["direct"]["p99_ms"] for r in runs)
                    row[name] = med
                    cpu = (
                        f"{med['cpu_us_per_chunk']:>8.1f}{med['cpu_raw_us_per_chunk']:>8.1f}"
                        if "cpu_us_per_chunk" in med
                        else f"{'':>16}"
                    )
                    print(f"{n:>8}{name:>9}{med['p50_ms']:>9.2f}{med['p99_ms']:>9.2f}{med['added_p50_ms']:>8.2f}"
                          f"{med['added_p99_ms']:>8.2f}{med['chunks_per_s']:>10.0f}{med['failed']:>7.0f}{cpu}",
                          flush=True)  # fmt: skip
                rows.append(row)
        finally:
            if envoy_floor is not None:
                envoy_floor.stop()
            if floor is not None:
                floor.stop()
            stack.close()
    if ns.json:
        Path(ns.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
