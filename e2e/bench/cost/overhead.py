"""Latency the EPP adds: client → Envoy+EPP → simulator vs client → Envoy → simulator, side by side.

One Envoy has two listeners: the gateway (ext_proc → our EPP → ORIGINAL_DST) and a `direct` listener
without ext_proc, where the client names the simulator in `x-gateway-destination-endpoint` itself. The
simulator answers at once (no modelled latency), requests alternate between the two listeners at the same
open-loop rate, so both paths see the same machine load. Reported per (strategy, prompt size, rate):
p50/p99 of each path and the added latency (gateway − direct).

    python -m e2e.bench.cost.overhead                # 1k/8k/32k-token prompts at two rates each, approximate + precise
    python -m e2e.bench.cost.overhead --points "1024:20" --duration 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
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
from e2e.workloads.text import TextFactory

DEST = "x-gateway-destination-endpoint"


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
    p.add_argument("--strategies", default="approximate,precise")
    p.add_argument("--response-mode", default=None, help="Envoy response_body_mode, e.g. NONE (no usage metrics)")
    p.add_argument("--json", help="write the rows here")
    ns = p.parse_args(argv)
    points = [
        (int(size), [float(r) for r in rates.split(",")])
        for size, rates in (pt.split(":") for pt in ns.points.split(";"))
    ]
    texts = TextFactory(3)
    rows = []
    sim_args = ["--prefill-overhead", "0", "--prefill-time-per-token", "0", "--inter-token-latency", "0",
                "--num-gpu-blocks", "65536", "--max-num-seqs", "256", "--max-model-len", "65536"]  # fmt: skip
    print(f"{'strategy':<12}{'tokens':>7}{'rate':>6}{'gw p50':>9}{'gw p99':>9}{'dir p50':>9}{'dir p99':>9}"
          f"{'+p50':>8}{'+p99':>8}{'err':>5}")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="pyepp-overhead-") as tmp, start_simulators(1, base_args=sim_args) as sims:
        sim = sims[0]
        model = "Qwen/Qwen2.5-0.5B-Instruct"
        for strategy in ns.strategies.split(","):
            work = Path(tmp) / strategy
            work.mkdir()
            stack = start_stack(
                work, backends=[], config=config_text(strategy, sims), epp_args=["--log-level", "warning"],
                envoy_overrides={"direct_port": free_port()}, response_mode=ns.response_mode,
            )  # fmt: skip
            try:
                direct = f"http://127.0.0.1:{stack.envoy.opts.direct_port}"
                for size, rates in points:
                    # 8 prompts per size sharing a prefix, like a real workload (the prefix scorers have work to do)
                    prefix = texts.text(("prefix", size), size // 2)
                    prompts = [prefix + texts.text(("q", size, i), size - size // 2) for i in range(8)]
                    asyncio.run(_measure(stack.url, direct, sim.hostport, prompts, 5, 1.0, model))  # warm up
                    for rate in rates:
                        gw, dr, err = asyncio.run(
                            _measure(stack.url, direct, sim.hostport, prompts, rate, ns.duration, model)
                        )
                        row = {
                            "strategy": strategy, "tokens": size, "rate": rate,
                            "gw_p50_ms": percentile(gw, 0.5) * 1e3, "gw_p99_ms": percentile(gw, 0.99) * 1e3,
                            "direct_p50_ms": percentile(dr, 0.5) * 1e3, "direct_p99_ms": percentile(dr, 0.99) * 1e3,
                            "errors": err, "n": len(gw) + len(dr),
                        }  # fmt: skip
                        row["added_p50_ms"] = row["gw_p50_ms"] - row["direct_p50_ms"]
                        row["added_p99_ms"] = row["gw_p99_ms"] - row["direct_p99_ms"]
                        rows.append(row)
                        print(f"{strategy:<12}{size:>7}{rate:>6.0f}{row['gw_p50_ms']:>9.2f}{row['gw_p99_ms']:>9.2f}"
                              f"{row['direct_p50_ms']:>9.2f}{row['direct_p99_ms']:>9.2f}{row['added_p50_ms']:>8.2f}"
                              f"{row['added_p99_ms']:>8.2f}{err:>5}", flush=True)  # fmt: skip
            finally:
                stack.close()
    if ns.json:
        Path(ns.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
