"""`make bench-routing`: the routing workload suite, every strategy side by side on the same requests.

Each cell is (workload, pods, block size). Per cell the simulated pods (e2e.sim, shared-prefill model: FCFS
prefill at `--prefill-tokens-per-second` per pod, decodes slowed while a prefill runs, a KV cache of fixed
capacity with LRU eviction and KV events) are started once; for each strategy their caches are reset, an EPP
with that strategy's config and an Envoy in front of it are started, and the same requests (same prompts, same
arrival times) are replayed through Envoy by an open-loop generator. Reported per cell and strategy: TTFT
p50/p90/p99, throughput, KV hit (cached prompt tokens / prompt tokens, from `usage.prompt_tokens_details`), the
unlimited-cache reuse bound of the workload (from its block hashes) and the share of it captured, and the spread
of requests over pods (coefficient of variation).

    python -m e2e.bench.bench_routing                       # the default (reduced) matrix, see docs/benchmarks.md
    python -m e2e.bench.bench_routing --workloads agentic,no-reuse --pods 4 --block-sizes 16
    python -m e2e.bench.bench_routing --quick               # small and fast (smoke test)
    python -m e2e.bench.bench_routing --plots docs/bench-routing   # also write one PNG per workload there

Results: <out>/results.json (every cell, every request), <out>/results.md (the tables), <out>/<workload>.png.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from e2e.bench import loadgen
from e2e.harness.http import post_json
from e2e.harness.stack import start_stack
from e2e.sim.launch import SimProcess, start_simulators
from e2e.sim.tokenizer import shared_tokenizer
from e2e.strategies import available_strategies, config_text
from e2e.workloads.agentic import agentic, no_reuse
from e2e.workloads.base import Workload
from e2e.workloads.mooncake import mooncake_conversations
from e2e.workloads.multiturn import multi_turn_chat
from e2e.workloads.reuse import prompt_ids, reuse_bound
from e2e.workloads.shared_prefix import shared_prefix

TRACE = Path("/work/shared/traces/conversation_trace.jsonl")
REPO_TRACE = Path(__file__).resolve().parents[1] / "workloads" / "data" / "conversation_trace.jsonl"
SERVED_HEADER = "x-inference-pod"


@dataclass(frozen=True)
class SimModel:
    """The simulated pod (time-compressed: a 0.5B-class engine on a small GPU)."""

    prefill_tokens_per_second: float = 1000.0
    prefill_overhead: float = 0.010
    inter_token_latency: float = 0.010
    prefill_interference: float = 0.5
    max_num_seqs: int = 6
    time_factor_under_load: float = 1.5

    def args(self, block_size: int, kv_tokens: int) -> list[str]:
        return [
            "--block-size", str(block_size), "--num-gpu-blocks", str(max(8, kv_tokens // block_size)),
            "--max-num-seqs", str(self.max_num_seqs),
            "--prefill-tokens-per-second", str(self.prefill_tokens_per_second),
            "--prefill-overhead", str(self.prefill_overhead),
            "--inter-token-latency", str(self.inter_token_latency),
            "--prefill-interference", str(self.prefill_interference),
            "--time-factor-under-load", str(self.time_factor_under_load),
        ]  # fmt: skip


@dataclass(frozen=True)
class WorkloadSpec:
    """A workload at a pod count: `make(pods, scale)` builds the requests; `kv_tokens` is the KV capacity per pod."""

    name: str
    make: Callable[[int, float], Workload]
    kv_tokens: int
    warmup: float  # requests arriving in the first `warmup` seconds are sent but not counted
    about: str


def trace_path() -> Path:
    return TRACE if TRACE.exists() else REPO_TRACE


def _per_pod(pods: int) -> float:
    return pods / 4.0


WORKLOADS: dict[str, WorkloadSpec] = {
    spec.name: spec
    for spec in [
        WorkloadSpec(
            "shared-prefix-demo",
            lambda pods, s: shared_prefix(
                num_groups=16,
                num_prompts_per_group=8,
                system_prompt_len=1024,
                question_len=64,
                output_len=16,
                rate=8.0 * _per_pod(pods),
                num_requests=int(200 * s * _per_pod(pods)),
                seed=1,
            ),
            kv_tokens=16384,
            warmup=5.0,
            about="`make demo`'s shape: 16 system prompts of 1024 tokens x 8 questions of 64 tokens",
        ),
        WorkloadSpec(
            "shared-prefix-150x5",
            lambda pods, s: shared_prefix(
                num_groups=30 * pods // 4,
                num_prompts_per_group=5,
                system_prompt_len=1200,
                question_len=240,
                output_len=16,
                rate=5.0 * _per_pod(pods),
                num_requests=int(150 * s * _per_pod(pods)),
                seed=2,
            ),
            kv_tokens=16384,
            warmup=5.0,
            about="llm-d blog's 150 groups x 5 prompts (6000 + 1200 tokens) scaled down: 30 groups per 4 pods x 5 "
            "prompts, 1200 + 240 tokens; the system prompts fill ~55% of the cluster's KV capacity",
        ),
        WorkloadSpec(
            "multi-turn",
            lambda pods, s: multi_turn_chat(
                num_sessions=int(24 * _per_pod(pods) * s),
                turns=5,
                system_prompt_len=1000,
                user_len=150,
                output_len=16,
                rate=5.0 * _per_pod(pods),
                seed=3,
            ),
            kv_tokens=6144,
            warmup=3.0,
            about="chat sessions sharing one 1000-token system prompt, 5 turns each resending the whole "
            "conversation (150-token user turns); the cluster's KV capacity is about the sessions' working set",
        ),
        WorkloadSpec(
            "agentic",
            lambda pods, s: agentic(
                num_agents=int(14 * _per_pod(pods) * s),
                steps=6,
                system_prompt_len=1500,
                task_len=150,
                tool_output_len=(80, 400),
                output_len=16,
                agent_rate=0.8 * _per_pod(pods),
                step_gap=1.5,
                fanout_prob=0.3,
                fanout=(3, 4),
                subagent_steps=2,
                seed=4,
            ),
            kv_tokens=16384,
            warmup=3.0,
            about="agents sharing a 1500-token tool prompt; each step appends a tool output (80-400 tokens); "
            "30% of steps fan out 3-4 sub-agents at once (a burst sharing the agent's context), 2 steps each",
        ),
        WorkloadSpec(
            "mooncake",
            lambda pods, s: mooncake_conversations(
                trace_path(),
                every=max(1, round(45 / _per_pod(pods) / s)),
                duration=30.0 * s,
                block_tokens=16,
                max_output=16,
            ),
            kv_tokens=16384,
            warmup=5.0,
            about="Mooncake FAST'25 conversation trace: whole conversations (second block id % k == 0; k = 45 at "
            "4 pods, 22 at 8), 512-token blocks -> 16 tokens, the hour compressed to 30 s, outputs capped at 16",
        ),
        WorkloadSpec(
            "no-reuse",
            lambda pods, s: no_reuse(
                num_requests=int(150 * s * _per_pod(pods)),
                prompt_len=(300, 900),
                output_len=16,
                rate=5.0 * _per_pod(pods),
                seed=5,
            ),
            kv_tokens=16384,
            warmup=3.0,
            about="unique prompts of 300-900 tokens: nothing to reuse, only load balance matters",
        ),
    ]
}


@dataclass
class Cell:
    workload: str
    pods: int
    block_size: int
    requests: int
    duration: float
    bound: float  # unlimited-cache reuse bound (share of prompt tokens)
    params: dict[str, Any]
    summaries: list[dict[str, Any]] = field(default_factory=list)


def _post_ok(url: str, body: object, timeout: float) -> None:
    r = post_json(url, body, timeout=timeout)
    if r.status != 200:
        raise RuntimeError(f"POST {url}: HTTP {r.status}: {r.body[:200]!r}")


def reset_caches(sims: Sequence[SimProcess]) -> None:
    for s in sims:
        _post_ok(s.url + "/reset_prefix_cache", {}, timeout=10)


def warm_up(url: str, model: str) -> None:
    """One request through the whole path, so one-time costs (tokenizer load, connections) are not measured."""
    _post_ok(url + "/v1/completions", {"model": model, "prompt": "warm up", "max_tokens": 1}, timeout=60)


class Progress:
    """A one-line progress bar on stderr."""

    def __init__(self, label: str, total: int) -> None:
        self.label, self.total, self.start = label, total, time.monotonic()

    def __call__(self, done: int, total: int) -> None:
        if done % max(1, total // 25) and done != total:
            return
        width = 25
        filled = width * done // total
        elapsed = time.monotonic() - self.start
        sys.stderr.write(
            f"\r  {self.label:<14} [{'#' * filled}{'.' * (width - filled)}] {done}/{total} {elapsed:5.1f}s"
        )
        if done == total:
            sys.stderr.write("\n")
        sys.stderr.flush()

    @staticmethod
    def enabled() -> bool:
        return sys.stderr.isatty()


def run_strategy(
    strategy: str, sims: Sequence[SimProcess], workload: Workload, block_size: int, workdir: Path
) -> tuple[list[loadgen.Result], float]:
    text = config_text(strategy, sims, block_size=block_size, prefill_tps=SimModel.prefill_tokens_per_second)
    d = workdir / f"{strategy}-{time.monotonic_ns()}"
    d.mkdir(parents=True, exist_ok=True)
    stack = start_stack(d, backends=[], config=text, epp_args=["--log-level", "warning"])
    try:
        warm_up(stack.url, str(workload.requests[0].body["model"]))
        reset_caches(sims)
        time.sleep(0.5)  # the EPP sees the caches cleared (events) and fresh metrics before traffic
        return asyncio.run(
            loadgen.run(stack.url, workload.requests, served_header=SERVED_HEADER,
                        progress=Progress(strategy, len(workload.requests)) if Progress.enabled() else None)
        )  # fmt: skip
    finally:
        stack.close()


def summary_dict(s: loadgen.RunSummary, bound: float) -> dict[str, Any]:
    d = s.as_dict()
    d["bound"] = bound
    d["captured"] = s.kv_hit_rate / bound if bound > 0 else float("nan")
    return d


def run_cell(
    spec: WorkloadSpec,
    pods: int,
    block_size: int,
    strategies: Sequence[str],
    model: SimModel,
    scale: float,
    workdir: Path,
    raw_out: dict[str, Any],
) -> Cell:
    workload = spec.make(pods, scale)
    tok = shared_tokenizer()
    ids = [prompt_ids(r, tok) for r in workload.requests]
    bound = reuse_bound(workload.requests, block_size, ids=ids, count_after=spec.warmup).share
    cell = Cell(spec.name, pods, block_size, len(workload.requests), workload.duration, bound, workload.params)
    cell.params["warmup_s"] = spec.warmup
    print(
        f"\n== {spec.name}: {pods} pods, block {block_size}: {len(workload.requests)} requests over "
        f"{workload.duration:.0f}s, {sum(map(len, ids)) / max(1, len(ids)):.0f} prompt tokens avg, "
        f"reuse bound {bound:.1%}, KV {spec.kv_tokens} tokens/pod",
        flush=True,
    )
    with start_simulators(
        pods, base_args=model.args(block_size, spec.kv_tokens), per_sim_args=lambda i: ["--seed", str(i)]
    ) as sims:
        pod_names = [f"sim-{s.http_port}" for s in sims]
        for strategy in strategies:
            results, duration = run_strategy(strategy, sims, workload, block_size, workdir)
            counted = [r for r, q in zip(results, workload.requests, strict=True) if q.arrival >= spec.warmup]
            span = max(1e-9, duration - spec.warmup)
            s = loadgen.summarize(strategy, counted, span, pod_names)
            cell.summaries.append(summary_dict(s, bound))
            raw_out[f"{spec.name}/{pods}/{block_size}/{strategy}"] = [
                (r.ttft, r.status, r.cached_tokens, r.prompt_tokens, r.served_by) for r in results
            ]
    print(table(cell), flush=True)
    return cell


def _ms(x: float) -> str:
    return "-" if x != x else f"{x * 1000:.0f}"


def table(cell: Cell, markdown: bool = False) -> str:
    cols = ["strategy", "ok/n", "TTFT p50 ms", "p90", "p99", "req/s", "KV hit", "bound", "captured", "pods CoV",
            "p90 vs best other"]  # fmt: skip
    rows = []
    for s in cell.summaries:
        others = [o["ttft_p90"] for o in cell.summaries if o["label"] != s["label"] and o["ttft_p90"] == o["ttft_p90"]]
        best = min(others, default=float("nan"))
        rows.append([
            s["label"], f"{s['ok']}/{s['n']}", _ms(s["ttft_p50"]), _ms(s["ttft_p90"]), _ms(s["ttft_p99"]),
            f"{s['throughput_rps']:.1f}", f"{s['kv_hit_rate']:.1%}", f"{s['bound']:.1%}",
            f"{s['captured']:.0%}" if s["captured"] == s["captured"] else "-", f"{s['load_cv']:.2f}",
            f"{s['ttft_p90'] / best:.2f}x" if best and best == best else "-",
        ])  # fmt: skip
    if markdown:
        out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        out += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(out)
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]
    fmt = "  ".join(f"{{:<{w}}}" if i == 0 else f"{{:>{w}}}" for i, w in enumerate(widths))
    return "\n".join([fmt.format(*cols)] + [fmt.format(*r) for r in rows])


def plot(path: Path, workload: str, cells: Sequence[Cell]) -> None:
    """One figure per workload: TTFT p50/p90/p99 per strategy (log scale), one panel per (pods, block size)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = [c for c in cells if c.workload == workload]
    if not cells:
        return
    fig, axes = plt.subplots(1, len(cells), figsize=(4.2 * len(cells) + 1, 4.2), dpi=100, squeeze=False)
    for ax, c in zip(axes[0], cells, strict=True):
        labels = [s["label"] for s in c.summaries]
        x = range(len(labels))
        for k, (q, alpha) in enumerate((("ttft_p50", 1.0), ("ttft_p90", 0.7), ("ttft_p99", 0.4))):
            vals = [max(1e-4, s[q]) * 1000 if s[q] == s[q] else 0 for s in c.summaries]
            ax.bar([i + (k - 1) * 0.27 for i in x], vals, width=0.27, alpha=alpha, label=q.replace("ttft_", ""),
                   color="tab:blue")  # fmt: skip
        ax.set_yscale("log")
        ax.set_xticks(list(x))
        ax.set_xticklabels(labels, rotation=40, ha="right", fontsize=8)
        ax.set_title(f"{c.pods} pods, block {c.block_size} (bound {c.bound:.0%})", fontsize=9)
        ax.grid(True, axis="y", which="both", alpha=0.3)
    axes[0][0].set_ylabel("TTFT ms (p50 / p90 / p99), log")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"{workload}: TTFT by routing strategy", fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def markdown(cells: Sequence[Cell], command: str) -> str:
    out = [f"Command: `{command}`", ""]
    for c in cells:
        out.append(
            f"**{c.workload}, {c.pods} pods, block {c.block_size}** ({c.requests} requests over {c.duration:.0f} s, "
            f"reuse bound {c.bound:.1%})"
        )
        out.append("")
        out.append(table(c, markdown=True))
        out.append("")
    return "\n".join(out)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m e2e.bench.bench_routing", description=__doc__.split("\n\n")[0])
    a = p.add_argument
    a("--workloads", default=",".join(WORKLOADS), help=f"comma list of {', '.join(WORKLOADS)}")
    a("--strategies", default="", help="comma list (default: every available strategy)")
    a("--pods", default="4,8", help="comma list of pod counts")
    a("--block-sizes", default="16,64", help="comma list of KV block sizes")
    a("--cells", default="", help="explicit pods:block list, e.g. 4:16,8:64 (overrides --pods/--block-sizes)")
    a("--scale", type=float, default=1.0, help="workload length factor (requests, sessions, duration)")
    a("--quick", action="store_true", help="scale 0.3, 4 pods, block 16")
    a("--out", default="e2e/out/bench-routing")
    a("--plots", default="", help="directory for the per-workload PNGs (default: --out)")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    ns = parse_args(argv)
    known = available_strategies()
    strategies = [s.strip() for s in ns.strategies.split(",") if s.strip()] or known
    for s in strategies:
        if s not in known:
            print(f"unknown or unavailable strategy {s!r}; available: {', '.join(known)}", file=sys.stderr)
            return 2
    workloads = [w.strip() for w in ns.workloads.split(",") if w.strip()]
    for w in workloads:
        if w not in WORKLOADS:
            print(f"unknown workload {w!r}; choose from {', '.join(WORKLOADS)}", file=sys.stderr)
            return 2
    if ns.quick:
        ns.scale, ns.cells = 0.3, ns.cells or "4:16"
    if ns.cells:
        grid = [(int(a), int(b)) for a, b in (c.split(":") for c in ns.cells.split(","))]
    else:
        grid = [(int(p), int(b)) for p in ns.pods.split(",") for b in ns.block_sizes.split(",")]
    out = Path(ns.out)
    plots = Path(ns.plots) if ns.plots else out
    model = SimModel()
    cells: list[Cell] = []
    raw: dict[str, Any] = {}
    command = "python -m e2e.bench.bench_routing " + " ".join(sys.argv[1:] if argv is None else argv)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="pyepp-bench-routing-") as tmp:
        for w in workloads:
            for pods, bs in grid:
                cells.append(run_cell(WORKLOADS[w], pods, bs, strategies, model, ns.scale, Path(tmp), raw))
                _write(out, cells, raw, command, model)
            plot(plots / f"{w}.png", w, cells)
    print(f"\n{len(cells)} cells, {len(strategies)} strategies in {time.monotonic() - t0:.0f}s; wrote {out}/results.*")
    failed = sum(s["n"] - s["ok"] for c in cells for s in c.summaries)
    if failed:
        print(f"{failed} requests failed", file=sys.stderr)
    return 0 if failed == 0 else 1


def _write(out: Path, cells: Sequence[Cell], raw: dict[str, Any], command: str, model: SimModel) -> None:
    out.mkdir(parents=True, exist_ok=True)
    doc = {
        "command": command,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "sim_model": asdict(model),
        "workloads": {
            k: {"kv_tokens": v.kv_tokens, "warmup_s": v.warmup, "about": v.about} for k, v in WORKLOADS.items()
        },
        "cells": [asdict(c) for c in cells],
        "requests": raw,
    }
    (out / "results.json").write_text(json.dumps(doc))
    (out / "results.md").write_text(markdown(cells, command))


if __name__ == "__main__":
    raise SystemExit(main())
