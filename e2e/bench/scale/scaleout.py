"""Scale-out on the routing suite's cells: one EPP process against N active-active replicas behind one Envoy, the
default chain as shipped (pyepp-default) and nothing configured for sharing but the Redis address
(`--cross-replica-address`, what the chart passes when `replicas > 1`).

Per workload (the suite's cells: `make demo`'s shape, multi-turn, Mooncake; 4 simulated pods, block 16, the
suite's pod model and offered load, equal for every configuration), each configuration runs on the same requests
from caches reset on every pod, with a fresh redis-server; the order rotates each repeat. Reported per
configuration: TTFT p50/p90/p99 and KV hit over the whole run (cold start included) and after the suite's warm-up,
and each repeat's ratio to `1` of the same repeat (medians over repeats).

    python -m e2e.bench.scale.scaleout --configs 1,r2,r3 --repeats 3      # ~20 min on 2 cores
    python -m e2e.bench.scale.scaleout --workloads shared-prefix-demo --repeats 1 --scale 0.5

Configurations: `1` (one process), `rN` (N replicas sharing through Redis), `rN-local` (N replicas, no sharing),
`wN` (one `epp serve --workers N`, Envoy opening a connection per ext_proc stream in flight so the kernel spreads them).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from e2e.bench import loadgen
from e2e.bench.routing.suite import WORKLOADS, SimModel, reset_caches, start_sims, warm_up
from e2e.harness.redis import redis_server
from e2e.harness.replicas import ReplicatedStack, start_replicas
from e2e.sim.launch import SimProcess
from e2e.strategies import OURS, config_text

SERVED_HEADER = "x-inference-pod"
DEFAULT_WORKLOADS = ("shared-prefix-demo", "multi-turn", "mooncake")
# as the suite's EPPs: pod health from scrapes off (a loaded box's slow /metrics is not a dead pod)
EPP_ARGS = ["--log-level", "warning", "--endpoint-stale-after", "0", "--endpoint-max-scrape-failures", "0"]


def parse_config_name(name: str) -> tuple[int, bool, int]:
    """`1`, `rN`, `rN-local`, `wN` → (replicas, shared through Redis, workers)."""
    if name == "1":
        return 1, False, 1
    bad = ValueError(f"unknown configuration {name!r}: 1, rN, rN-local or wN")
    if name.startswith("w"):
        if not name[1:].isdigit() or int(name[1:]) < 1:
            raise bad
        return 1, False, int(name[1:])
    if not name.startswith("r"):
        raise bad
    n, _, local = name[1:].partition("-")
    if local not in ("", "local") or not n.isdigit() or int(n) < 1:
        raise bad
    return int(n), local == "", 1


def start(workdir: Path, sims: Sequence[SimProcess], model: SimModel, name: str, redis_url: str) -> ReplicatedStack:
    replicas, shared, workers = parse_config_name(name)
    text = config_text(OURS, sims, block_size=16, prefill_tps=model.effective_prefill_tps)
    args = [*EPP_ARGS, *(["--cross-replica-address", redis_url] if shared else [])]
    return start_replicas(workdir, text, replicas, extra_args=args, ready_timeout=180.0, workers=workers)


def run_one(stack: ReplicatedStack, sims: Sequence[SimProcess], requests: Sequence[Any]) -> tuple[list[Any], float]:
    model = str(requests[0].body["model"])
    for _ in range(2 * len(stack.epps) * stack.workers):  # streams spread over the EPPs: each loads its tokenizer
        warm_up(stack.url, model)
    reset_caches(sims)
    time.sleep(1.0)  # the EPPs see the caches cleared (events) and fresh metrics before traffic
    return asyncio.run(loadgen.run(stack.url, list(requests), served_header=SERVED_HEADER))


def summary(results: Sequence[Any], duration: float, pods: Sequence[str]) -> dict[str, float]:
    s = loadgen.summarize("", results, duration, pods)
    return {"ttft_p50": s.ttft_p50, "ttft_p90": s.ttft_p90, "ttft_p99": s.ttft_p99, "kv_hit": s.kv_hit_rate,
            "ok": s.ok, "n": s.n}  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m e2e.bench.scale.scaleout", description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", default="1,r2,r3")
    p.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS))
    p.add_argument("--pods", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--scale", type=float, default=1.0, help="the suite's workload scale (requests)")
    p.add_argument("--out", default="e2e/out/bench-scaleout.json")
    ns = p.parse_args(argv)
    configs = [c.strip() for c in ns.configs.split(",") if c.strip()]
    for c in configs:
        parse_config_name(c)
    model = SimModel()
    rows: list[dict[str, Any]] = []
    failed = 0
    with tempfile.TemporaryDirectory(prefix="pyepp-scaleout-") as tmp:
        for wname in [w.strip() for w in ns.workloads.split(",") if w.strip()]:
            spec = WORKLOADS[wname]
            workload, warmup = model.timed(spec.make(ns.pods, ns.scale, 0), spec.warmup)
            warmup = min(warmup, workload.duration / 2)
            print(f"\n== {wname}: {len(workload.requests)} requests over {workload.duration:.0f}s", flush=True)
            with start_sims(model, ns.pods, 16, spec.kv_tokens) as sims:
                pods = [f"sim-{s.http_port}" for s in sims]
                for rep in range(ns.repeats):
                    for k in range(len(configs)):
                        name = configs[(k + rep) % len(configs)]
                        with redis_server() as url:
                            stack = start(Path(tmp) / f"{wname}-{name}-{rep}", sims, model, name, url)
                            try:
                                results, duration = run_one(stack, sims, workload.requests)
                                picks = stack.picks()
                            finally:
                                stack.close()
                        counted = [r for r, q in zip(results, workload.requests, strict=True) if q.arrival >= warmup]
                        row = {"workload": wname, "config": name, "repeat": rep, "load1": os.getloadavg()[0],
                               "whole": summary(results, duration, pods),
                               "after_warmup": summary(counted, max(1e-9, duration - warmup), pods),
                               "picks_per_replica": picks}  # fmt: skip
                        failed += int(row["whole"]["n"] - row["whole"]["ok"])
                        rows.append(row)
                        w = row["whole"]
                        print(
                            f"  {name:<9} rep {rep}: whole run TTFT p50 {w['ttft_p50'] * 1e3:7.1f} ms"
                            f"  p90 {w['ttft_p90'] * 1e3:7.1f}  p99 {w['ttft_p99'] * 1e3:7.1f}  hit {w['kv_hit']:.3f}"
                            f"  ok {w['ok']}/{w['n']}  picks/replica {[int(x) for x in picks]}"
                            f"  load {row['load1']:.1f}",
                            flush=True,
                        )
    report = tables(rows, configs)
    print(report)
    out = Path(ns.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(ns), "runs": rows, "report": report}, indent=1))
    print(f"wrote {out}")
    return 1 if failed else 0


HEADER = (
    "| workload | config | TTFT p50 | p90 | p99 | KV hit | p90 / 1 | p99 / 1 | hit − 1 (pts) | p90 / 1 after warm-up |"
)


def _ratio(mine: Sequence[dict[str, Any]], base: dict[int, dict[str, Any]], part: str, key: str) -> float:
    """Median over repeats of `key` (of the whole run or after warm-up) against `1` of the same repeat: a ratio for
    TTFTs, a difference in points for the hit rate."""
    vals = []
    for r in mine:
        b = base.get(r["repeat"])
        if b is not None:
            a, z = r[part][key], b[part][key]
            vals.append(100 * (a - z) if key == "kv_hit" else a / z)
    return statistics.median(vals) if vals else float("nan")


def tables(rows: Sequence[dict[str, Any]], configs: Sequence[str]) -> str:
    """Markdown: per workload and configuration, medians over repeats of the whole run's TTFT and hit, and of each
    repeat's ratio to `1` in the same repeat (whole run p90, p99, hit; after warm-up p90)."""
    lines = [HEADER, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for wname in dict.fromkeys(r["workload"] for r in rows):
        base = {r["repeat"]: r for r in rows if r["workload"] == wname and r["config"] == "1"}
        for c in configs:
            mine = [r for r in rows if r["workload"] == wname and r["config"] == c]
            if not mine:
                continue
            w = {k: statistics.median(r["whole"][k] for r in mine) for k in ("ttft_p50", "ttft_p90", "ttft_p99")}
            hit = statistics.median(r["whole"]["kv_hit"] for r in mine)
            ratios = "| | | |"
            if c != "1" and base:
                ratios = (
                    f"| {_ratio(mine, base, 'whole', 'ttft_p90'):.2f} | {_ratio(mine, base, 'whole', 'ttft_p99'):.2f}"
                    f" | {_ratio(mine, base, 'whole', 'kv_hit'):+.1f}"
                    f" | {_ratio(mine, base, 'after_warmup', 'ttft_p90'):.2f}"
                )
            lines.append(
                f"| {wname} | {c} | {w['ttft_p50'] * 1e3:.0f} ms | {w['ttft_p90'] * 1e3:.0f} ms "
                f"| {w['ttft_p99'] * 1e3:.0f} ms | {hit:.3f} {ratios} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
