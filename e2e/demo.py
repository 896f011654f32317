"""`make demo`: Envoy + pyepp + N simulated vLLM pods on loopback; a shared-prefix workload per routing strategy.

For each strategy (precise prefix-cache routing from KV events, GIE's approximate prefix routing, load-only,
round-robin, random) the simulators' caches are reset, an EPP with that strategy's config and an Envoy in
front of it are started, the same workload (same prompts, same arrival times) is replayed through Envoy,
and the results are compared: KV hit rate, TTFT p50/p90/p99, throughput and load balance across pods.
Writes `demo-results.json` (raw per-request results) and `demo-ttft.png` (TTFT distribution per strategy).

    python -m e2e.demo                 # the default, a few minutes on 2 cores
    python -m e2e.demo --quick         # a smaller run (used by the smoke test)
    python -m e2e.demo --workload multi-turn | mooncake
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from e2e.bench import loadgen, report
from e2e.harness.http import post_json
from e2e.harness.stack import start_stack
from e2e.sim.launch import SimProcess, start_simulators
from e2e.strategies import PROFILES, config_text
from e2e.workloads.base import Workload
from e2e.workloads.mooncake import mooncake_replay
from e2e.workloads.multiturn import multi_turn_chat
from e2e.workloads.shared_prefix import shared_prefix

MOONCAKE_SAMPLE = Path(__file__).parent / "workloads" / "data" / "mooncake_sample.jsonl"
SERVED_HEADER = "x-inference-pod"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m e2e.demo", description=__doc__.split("\n\n")[0])
    a = p.add_argument
    a("--pods", type=int, default=4)
    a("--strategies", default=",".join(PROFILES), help=f"comma list of {', '.join(PROFILES)}")
    a("--workload", choices=["shared-prefix", "multi-turn", "mooncake"], default="shared-prefix")
    a("--groups", type=int, default=16, help="shared-prefix: number of system prompts")
    a("--prompts-per-group", type=int, default=8)
    a("--system-len", type=int, default=1024, help="system prompt tokens")
    a("--question-len", type=int, default=64)
    a("--output-len", type=int, default=16)
    a("--rate", type=float, default=20.0, help="requests per second (Poisson)")
    a("--requests", type=int, default=600)
    a("--seed", type=int, default=1)
    # simulator: a small GPU whose cache holds half of the groups' system prompts
    a("--block-size", type=int, default=16)
    a("--gpu-blocks", type=int, default=512, help="KV-cache capacity per pod, in blocks")
    a("--max-num-seqs", type=int, default=4)
    a("--prefill-per-token", type=float, default=0.0005, help="seconds per uncached prompt token")
    a("--itl", type=float, default=0.005, help="seconds per output token")
    a("--load-factor", type=float, default=2.0, help="slowdown at max-num-seqs running (time_factor_under_load)")
    a("--quick", action="store_true", help="a small, fast run")
    a("--out", default="e2e/out/demo", help="directory for the JSON and PNG")
    ns = p.parse_args(argv)
    if ns.quick:
        ns.groups, ns.prompts_per_group, ns.requests, ns.rate = 8, 4, 60, 12.0
        ns.system_len, ns.gpu_blocks = 256, 192
    return ns


def make_workload(ns: argparse.Namespace) -> Workload:
    if ns.workload == "multi-turn":
        return multi_turn_chat(
            num_sessions=ns.groups, turns=4, system_prompt_len=ns.system_len, user_len=ns.question_len,
            output_len=ns.output_len, rate=ns.rate, seed=ns.seed,
        )  # fmt: skip
    if ns.workload == "mooncake":
        return mooncake_replay(MOONCAKE_SAMPLE, block_tokens=32, time_scale=0.05, max_output=ns.output_len)
    return shared_prefix(
        num_groups=ns.groups, num_prompts_per_group=ns.prompts_per_group, system_prompt_len=ns.system_len,
        question_len=ns.question_len, output_len=ns.output_len, rate=ns.rate, num_requests=ns.requests, seed=ns.seed,
    )  # fmt: skip


def sim_args(ns: argparse.Namespace) -> list[str]:
    return [
        "--block-size", str(ns.block_size), "--num-gpu-blocks", str(ns.gpu_blocks),
        "--max-num-seqs", str(ns.max_num_seqs), "--prefill-time-per-token", str(ns.prefill_per_token),
        "--inter-token-latency", str(ns.itl), "--time-factor-under-load", str(ns.load_factor),
        "--prefill-overhead", "0.005",
    ]  # fmt: skip


def _post_ok(url: str, body: object, timeout: float) -> None:
    r = post_json(url, body, timeout=timeout)
    if r.status != 200:
        raise RuntimeError(f"POST {url}: HTTP {r.status}: {r.body[:200]!r}")


def reset_caches(sims: Sequence[SimProcess]) -> None:
    for s in sims:
        _post_ok(s.url + "/reset_prefix_cache", {}, timeout=10)


class Progress:
    """A one-line progress bar on stderr."""

    def __init__(self, label: str, total: int) -> None:
        self.label, self.total, self.start = label, total, time.monotonic()

    def __call__(self, done: int, total: int) -> None:
        if done % max(1, total // 50) and done != total:
            return
        width = 30
        filled = width * done // total
        elapsed = time.monotonic() - self.start
        sys.stderr.write(
            f"\r  {self.label:<12} [{'#' * filled}{'.' * (width - filled)}] {done}/{total} {elapsed:5.1f}s"
        )
        if done == total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def warm_up(url: str, model: str) -> None:
    """One request through the whole path, so one-time costs (tokenizer load, connections) are not measured."""
    _post_ok(url + "/v1/completions", {"model": model, "prompt": "warm up", "max_tokens": 1}, timeout=60)


def run_strategy(
    strategy: str, sims: Sequence[SimProcess], workload: Workload, ns: argparse.Namespace, workdir: Path
) -> tuple[list[loadgen.Result], float]:
    text = config_text(strategy, sims, block_size=ns.block_size)
    (workdir / strategy).mkdir(parents=True, exist_ok=True)
    stack = start_stack(workdir / strategy, backends=[], config=text, epp_args=["--log-level", "warning"])
    try:
        warm_up(stack.url, str(workload.requests[0].body["model"]))
        reset_caches(sims)
        time.sleep(0.5)  # the EPP sees the caches cleared (events) and fresh metrics before traffic
        results, duration = asyncio.run(
            loadgen.run(
                stack.url, workload.requests, served_header=SERVED_HEADER,
                progress=Progress(strategy, len(workload.requests)),
            )
        )  # fmt: skip
    finally:
        stack.close()
    return results, duration


def main(argv: Sequence[str] | None = None) -> int:
    ns = parse_args(argv)
    strategies = [s.strip() for s in ns.strategies.split(",") if s.strip()]
    for s in strategies:
        if s not in PROFILES:
            print(f"unknown strategy {s!r}; choose from {', '.join(PROFILES)}", file=sys.stderr)
            return 2
    out = Path(ns.out)
    workload = make_workload(ns)
    print(
        f"workload {workload.name}: {len(workload.requests)} requests over {workload.duration:.0f}s, {workload.params}"
    )
    print(f"{ns.pods} simulated vLLM pods: {' '.join(sim_args(ns))}")
    raw: dict[str, list[loadgen.Result]] = {}
    summaries = []
    with (
        tempfile.TemporaryDirectory(prefix="pyepp-demo-") as tmp,
        start_simulators(ns.pods, base_args=sim_args(ns), per_sim_args=lambda i: ["--seed", str(i)]) as sims,
    ):
        pods = [f"sim-{s.http_port}" for s in sims]
        for strategy in strategies:
            results, duration = run_strategy(strategy, sims, workload, ns, Path(tmp))
            raw[strategy] = results
            summaries.append(loadgen.summarize(strategy, results, duration, pods))
    print()
    baseline = "precise" if "precise" in raw else None
    print(report.table(summaries, baseline=baseline))
    if baseline:
        base = next(s for s in summaries if s.label == baseline)
        for s in summaries:
            if s.label != baseline and base.ttft_p90 > 0:
                print(f"  TTFT p90: precise is {s.ttft_p90 / base.ttft_p90:.1f}x better than {s.label}")
    meta: dict[str, object] = {
        "args": vars(ns),
        "workload": workload.params,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    report.write_json(out / "demo-results.json", summaries, raw, meta)
    report.plot_ttft(out / "demo-ttft.png", raw, f"TTFT by routing strategy ({workload.name}, {ns.pods} pods)")
    print(f"\nwrote {out / 'demo-results.json'} and {out / 'demo-ttft.png'}")
    failed = sum(s.n - s.ok for s in summaries)
    if failed:
        print(f"{failed} requests failed", file=sys.stderr)
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
