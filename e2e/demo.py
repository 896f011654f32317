"""`make demo`: Envoy + pyepp + 4 simulated vLLM pods on loopback; a compact run of the routing suite.

Two workloads: the demo's own shape (`demo`: 16 system prompts of 1024 tokens x 8 questions of 64, at the original
demo's load: 20 req/s at full simulator speed, i.e. 6.7 req/s at the suite's time scale 3, for 30 s, the first 12 s
not counted) and the suite's (`e2e/bench/routing/suite.py`) multi-turn chat with a shared system prompt. The suite's
own `shared-prefix-demo` cell is the same shape at 4 req/s for ~27 s: too short for the cache-blind strategies'
queues to build, and mostly the cold start. For each, five strategies (random, GIE's
approximate prefix routing, llm-d's precise blend, llm-d v0.10's sticky-until-saturated default and pyepp's default,
`config/pyepp-default.yaml`) get the same requests at the same times through a fresh EPP and
Envoy, with the simulators' caches reset in between. Prints a table per workload (TTFT p50/p90/p99, throughput,
KV hit against the unlimited-cache bound, load spread) and how pyepp's default compares at p90; writes
`demo-results.json` (summaries, and every workload's per-request rows, each marked `counted` when the table counts it),
`demo-ttft.png` (TTFT distribution per strategy of the first workload's counted requests) and one `<workload>.png`
per workload (TTFT p50/p90/p99 per strategy).

    python -m e2e.demo                 # the default, about 6 minutes on 2 cores
    python -m e2e.demo --quick         # a smaller run (used by the smoke test)
    python -m e2e.demo --workloads agentic,no-reuse --strategies load,pyepp-default
    python -m e2e.demo --workloads demo --draws 3   # the demo cell over three draws (other seeds), medians tabled
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from e2e.bench.loadgen import Result
from e2e.bench.routing import report, suite
from e2e.bench.routing.suite import SERVED_HEADER, reset_caches, warm_up
from e2e.strategies import EXTERNAL, LLMD, OURS, available_strategies

__all__ = ["SERVED_HEADER", "main", "reset_caches", "warm_up"]  # the last three are used by other benchmarks
# Every strategy of the suite but round-robin and load: under the demo's overload the cache-blind strategies take
# 30-55 s each to drain their queues (most of the demo's time). Random stays as the cache-blind reference (the
# demo's goal ratio); the suite (`make bench-routing`) and `--strategies` run the others.
DEFAULT_STRATEGIES = ["random", "approximate", "precise", LLMD, OURS]
DEMO = suite.WorkloadSpec(
    "demo",
    lambda pods, s, d: suite.demo_shape(20.0 / 3 * pods / 4, int(267 * s * pods / 4), seed=1 + d),
    kv_tokens=8192,
    warmup=12.0,
    about="`make demo`'s shape at its original load (20 req/s at full speed): 16 system prompts of 1024 tokens x 8 "
    "questions of 64, 6.7 req/s for 40 s at time scale 3; a pod's cache holds about half of the system prompts",
)
WORKLOADS = {DEMO.name: DEMO, **suite.WORKLOADS}
# Shorter runs than the suite's (the demo's time budget, <= 6 minutes on 2 cores): the same rates and shapes, fewer
# requests. The demo shape keeps 18 s counted after its 12 s cold start (120 requests).
SCALES = {"demo": 0.75, "multi-turn": 0.6}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m e2e.demo", description=__doc__.split("\n\n")[0])
    a = p.add_argument
    a("--workloads", default="demo,multi-turn", help=f"comma list of {', '.join(WORKLOADS)}")
    a("--strategies", default=",".join(DEFAULT_STRATEGIES), help=f"comma list of {', '.join(available_strategies())}")
    a("--pods", type=int, default=4)
    a("--block-size", type=int, default=16)
    a("--scale", type=float, default=1.0, help="workload length factor")
    a("--quick", action="store_true", help="a small, fast run (one workload, scale 0.6)")
    a("--out", default="e2e/out/demo", help="directory for the JSON and PNGs")
    a("--variants", default="", help='JSON {"name": {params}}: adds strategies pyepp-default/<name> (tuning)')
    a("--draws", type=int, default=1, help="run each workload's draws 0..N-1 (other seeds) and table the medians")
    a("--engine", default="", help="spec.yaml: the pods run another vLLM-compatible server (e2e/external/)")
    a("--external", default="", help="comma list of name=spec.yaml: adds strategy <name>, another EPP run from the "
      "spec's command line (e2e/external/; see docs/benchmarks.md)")  # fmt: skip
    ns = p.parse_args(argv)
    if ns.draws < 1:
        p.error("--draws must be at least 1")
    if ns.quick:
        ns.scale = 0.6
        ns.workloads = ns.workloads if ns.workloads != p.get_default("workloads") else "demo"
    return ns


def main(argv: Sequence[str] | None = None) -> int:
    ns = parse_args(argv)
    strategies = [s.strip() for s in ns.strategies.split(",") if s.strip()]
    workloads = [w.strip() for w in ns.workloads.split(",") if w.strip()]
    if ns.variants:
        suite.VARIANTS.update(json.loads(ns.variants))
    try:
        suite.add_external(ns.external)
        suite.set_engine(ns.engine)
    except (ValueError, RuntimeError) as e:
        print(e, file=sys.stderr)
        return 2
    known = available_strategies() + [f"{OURS}/{v}" for v in suite.VARIANTS] + list(EXTERNAL)
    bad = [s for s in strategies if s not in known] + [w for w in workloads if w not in WORKLOADS]
    if bad:
        print(f"unknown strategy or workload: {', '.join(bad)}", file=sys.stderr)
        return 2
    out = Path(ns.out)
    raw: dict[str, Any] = {}
    cells: list[suite.Cell] = []
    t0 = time.monotonic()
    model = suite.SimModel()
    with (
        tempfile.TemporaryDirectory(prefix="pyepp-demo-") as tmp,
        contextlib.ExitStack() as render,
        suite.start_sims(model, ns.pods, ns.block_size, max(WORKLOADS[w].kv_tokens for w in workloads)) as sims,
    ):
        if suite.needs_render(strategies):
            render.enter_context(suite.render_server(model, ns.block_size))
        # one set of stacks for every workload: the next workload's first EPP starts during this one's last run
        stacks = suite.Stacks(sims, ns.block_size, Path(tmp), model)
        try:
            for i, w in enumerate(workloads):
                scale = ns.scale * SCALES.get(w, 1.0)
                then = strategies[0] if i + 1 < len(workloads) else None
                cells.append(
                    suite.run_cell(
                        WORKLOADS[w], ns.pods, ns.block_size, strategies, model, scale, Path(tmp), raw, sims,
                        stacks=stacks, then=then, repeats=ns.draws, draws=ns.draws > 1,
                    )
                )  # fmt: skip
        finally:
            stacks.close()
    print()
    for c in cells:
        base = next((s for s in c.summaries if s["label"] == OURS), None)
        if base is None or not base["ttft_p90"] > 0:
            continue
        gains = ", ".join(
            f"{times(s['ttft_p90'] / base['ttft_p90'])} vs {s['label']}" for s in c.summaries if s["label"] != OURS
        )
        print(f"{c.workload}: {OURS} TTFT p90 {base['ttft_p90'] * 1000:.0f} ms; {gains}")
        if len(c.repeats) > 1:
            print(f"{c.workload}: {OURS} p90 vs each, draw by draw: {per_draw(c)}")
        load = next((s for s in c.summaries if s["label"] == "load"), None)
        if load is not None and load["ttft_p99"] > 0:
            print(f"{c.workload}: {OURS} TTFT p99 {base['ttft_p99'] / load['ttft_p99']:.2f}x load's")
    print(f"\n{len(cells)} workloads x {len(strategies)} strategies in {time.monotonic() - t0:.0f}s")
    write(out, cells, raw, ns)
    failed = sum(s["n"] - s["ok"] for c in cells for s in c.summaries)
    if failed:
        print(f"{failed} requests failed", file=sys.stderr)
    return 0 if failed == 0 else 1


def times(ratio: float) -> str:
    """A ratio for the summary line: two decimals below 10 (0.93x must not read as 0.9x), one above."""
    return f"{ratio:.2f}x" if ratio < 10 else f"{ratio:.1f}x"


def per_draw(cell: suite.Cell) -> str:
    """Each other strategy's p90 over ours, one ratio per draw (the medians hide which draws a strategy won)."""
    others = [s["label"] for s in cell.summaries if s["label"] != OURS]
    parts = []
    for label in others:
        ratios = []
        for by in suite.p90_by_repeat(cell):
            ours, theirs = by.get(OURS, 0.0), by.get(label, 0.0)
            ratios.append(f"{theirs / ours:.2f}" if ours > 0 else "-")
        parts.append(f"{label} {', '.join(ratios)}")
    return "; ".join(parts)


def write(out: Path, cells: Sequence[suite.Cell], raw: dict[str, Any], ns: argparse.Namespace) -> None:
    """The JSON holds every workload's per-request rows (each says whether the table counts it: arrivals after the
    warm-up); the TTFT plot shows the counted requests only, as the table does."""
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for c in cells:
        results[c.workload] = {
            s["label"]: raw[f"{c.workload}/{c.pods}/{c.block_size}/{s['label']}"] for s in c.summaries
        }
    first = cells[0]
    doc = {
        "meta": {"args": vars(ns), "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "sim_model": asdict(suite.SimModel())},
        "cells": [asdict(c) for c in cells],
        "summaries": first.summaries,
        "results": results,
    }
    (out / "demo-results.json").write_text(json.dumps(doc, indent=1, default=str))
    counted = {
        label: [Result(**{k: row[k] for k in RESULT_FIELDS}) for row in rows if row["counted"]]
        for label, rows in results[first.workload].items()
    }
    n_counted = len(next(iter(counted.values()), []))
    title = (
        f"TTFT by routing strategy ({first.workload}, {first.pods} pods): the {n_counted} of {first.requests} "
        f"requests arriving after the {first.params.get('warmup_s', 0):.0f} s warm-up, as the table"
    )
    report.plot_ttft(out / "demo-ttft.png", counted, title)
    for c in cells:
        suite.plot(out / f"{c.workload}.png", c.workload, [c])
    print(f"wrote {out / 'demo-results.json'}, {out / 'demo-ttft.png'} and one PNG per workload")


RESULT_FIELDS = ("group", "status", "ttft", "e2e", "prompt_tokens", "cached_tokens", "completion_tokens", "served_by")


if __name__ == "__main__":
    raise SystemExit(main())
