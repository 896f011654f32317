"""What streaming through the EPP costs: every SSE chunk of a response passes through ext_proc (FULL_DUPLEX_STREAMED,
for usage and the model-name rewrite). N concurrent streams go through the gateway listener (Envoy + EPP) and the
same number through a `direct` listener of the same Envoy without ext_proc, at the same time, to one simulator
that streams a token every `--itl` seconds. Reported per concurrency: inter-chunk gap p50/p99 seen by the client
on each path, the added gap, and chunks/s per path.

    python -m e2e.bench.bench_streaming --concurrency 50,200 --tokens 200 --itl 0.01
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import aiohttp

from e2e.bench.loadgen import percentile
from e2e.harness.ports import free_port
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


async def _measure(gw: str, direct: str, dest: str, n: int, tokens: int) -> dict[str, float]:
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=600)) as s:
        t0 = time.perf_counter()
        tasks = [_stream(s, gw, {}, tokens) for _ in range(n)]
        tasks += [_stream(s, direct, {"x-gateway-destination-endpoint": dest}, tokens) for _ in range(n)]
        res = await asyncio.gather(*tasks)
        wall = time.perf_counter() - t0
    g = [x for r in res[:n] for x in r]
    d = [x for r in res[n:] for x in r]
    return {
        "concurrency": n, "gw_p50_ms": percentile(g, 0.5) * 1e3, "gw_p99_ms": percentile(g, 0.99) * 1e3,
        "direct_p50_ms": percentile(d, 0.5) * 1e3, "direct_p99_ms": percentile(d, 0.99) * 1e3,
        "gw_chunks_per_s": len(g) / wall, "direct_chunks_per_s": len(d) / wall,
        "gw_failed": sum(1 for r in res[:n] if not r), "direct_failed": sum(1 for r in res[n:] if not r),
    }  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m e2e.bench.bench_streaming")
    p.add_argument("--concurrency", default="50,200")
    p.add_argument("--tokens", type=int, default=200, help="tokens per stream")
    p.add_argument("--itl", type=float, default=0.01, help="the simulator's inter-token latency (s)")
    p.add_argument("--strategy", default="approximate")
    p.add_argument("--json", help="write the rows here")
    ns = p.parse_args(argv)
    sim_args = ["--prefill-overhead", "0", "--prefill-time-per-token", "0", "--inter-token-latency", str(ns.itl),
                "--num-gpu-blocks", "65536", "--max-num-seqs", "1024"]  # fmt: skip
    rows = []
    print(f"{'streams':>8}{'gw p50':>9}{'gw p99':>9}{'dir p50':>9}{'dir p99':>9}{'+p50':>8}{'+p99':>8}"
          f"{'gw ch/s':>9}{'dir ch/s':>9}{'fail':>6}")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="pyepp-stream-") as tmp, start_simulators(1, base_args=sim_args) as sims:
        sim = sims[0]
        stack = start_stack(
            Path(tmp), backends=[], config=config_text(ns.strategy, sims), epp_args=["--log-level", "warning"],
            envoy_overrides={"direct_port": free_port()},
        )  # fmt: skip
        try:
            direct = f"http://127.0.0.1:{stack.envoy.opts.direct_port}"
            asyncio.run(_measure(stack.url, direct, sim.hostport, 4, 10))  # warm up (tokenizer, connections)
            for n in (int(c) for c in ns.concurrency.split(",")):
                row = asyncio.run(_measure(stack.url, direct, sim.hostport, n, ns.tokens))
                row["added_p50_ms"] = row["gw_p50_ms"] - row["direct_p50_ms"]
                row["added_p99_ms"] = row["gw_p99_ms"] - row["direct_p99_ms"]
                rows.append(row)
                print(f"{n:>8}{row['gw_p50_ms']:>9.2f}{row['gw_p99_ms']:>9.2f}{row['direct_p50_ms']:>9.2f}"
                      f"{row['direct_p99_ms']:>9.2f}{row['added_p50_ms']:>8.2f}{row['added_p99_ms']:>8.2f}"
                      f"{row['gw_chunks_per_s']:>9.0f}{row['direct_chunks_per_s']:>9.0f}"
                      f"{row['gw_failed'] + row['direct_failed']:>6.0f}", flush=True)  # fmt: skip
        finally:
            stack.close()
    if ns.json:
        Path(ns.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
