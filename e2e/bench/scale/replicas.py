"""One EPP replica vs two active-active replicas behind one Envoy, on the same workload and simulators.

The routing is llm-d's "sticky until saturated" pipeline with the precise (KV-event) prefix producer:
prefix-cache-affinity-filter → token-load-scorer, fed by the inflight-load-producer. Both replicas see the same
KV events; what they do not see without help is each other's in-flight load and each other's picks (the
speculative prefix entries). Modes, interleaved and repeated:

- `1`: one replica (the reference);
- `2-shared`: two replicas sharing in-flight load through a real redis-server (redis-cross-replica-syncer,
  `dataLayer.crossReplicaSyncerPluginRef`, sync every `--sync-interval`; each booking is also published as it is
  made) and each pick's speculative prefix entry (published as it is made);
- `2-load`: two replicas sharing in-flight load but not the speculative entries (the precise producer's
  `syncCrossReplicaState: false`);
- `2-local`: two replicas, each counting only its own requests (`syncCrossReplicaState: false` on both);
- `1+idle` (not run by default): two replicas running, only the first in Envoy's cluster: one replica's routing
  with two replicas' CPU (both ingest every KV event), to tell routing from CPU contention on a small machine.

    python -m e2e.bench.scale.replicas            # ~6 minutes on 2 cores
    python -m e2e.bench.scale.replicas --quick

Prints per-run rows and the per-mode medians (TTFT p50/p90/p99, KV hit, requests-per-pod CV), and writes JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from e2e.bench import loadgen
from e2e.bench.procstat import cpu_seconds
from e2e.bench.progress import Progress
from e2e.bench.routing import affinity_trace
from e2e.demo import SERVED_HEADER, reset_caches, warm_up
from e2e.harness.http import metric_value
from e2e.harness.redis import redis_server
from e2e.harness.replicas import start_replicas
from e2e.sim.launch import SimProcess, start_simulators
from e2e.strategies import endpoints_yaml
from e2e.workloads.shared_prefix import shared_prefix


def cpu_snapshot(groups: dict[str, list[int]]) -> dict[str, float]:
    """CPU seconds per group; the bench's own process without its children (the stack it started)."""
    return {g: sum(cpu_seconds(pid, children=g != "bench") for pid in pids) for g, pids in groups.items()}


def sim_totals(sims: Sequence[SimProcess]) -> dict[str, float]:
    """The engines' own TTFT and queue time (sums and count over all pods), to tell the time spent before a request
    reaches an engine (Envoy + EPP) from the time spent in it."""
    out = {"ttft_sum": 0.0, "ttft_count": 0.0, "queue_sum": 0.0}
    for sim in sims:
        with urllib.request.urlopen(sim.url + "/metrics", timeout=10) as r:
            text = r.read().decode()
        out["ttft_sum"] += metric_value(text, "vllm:time_to_first_token_seconds_sum", default=0.0)
        out["ttft_count"] += metric_value(text, "vllm:time_to_first_token_seconds_count", default=0.0)
        out["queue_sum"] += metric_value(text, "vllm:request_queue_time_seconds_sum", default=0.0)
    return out


MODES = ("1", "2-shared", "2-load", "2-local", "1+idle")
DEFAULT_MODES = ("1", "2-shared", "2-local")


def config(sims: Sequence[SimProcess], redis_url: str, mode: str, ns: argparse.Namespace, run: int) -> str:
    mode, interval, _ = split_mode(mode)
    sync = "false" if mode == "2-local" else "true"
    spec_sync = "false" if mode in ("2-local", "2-load") else "true"
    return f"""\
plugins:
- type: precise-prefix-cache-producer
  parameters:
    tokenProcessorConfig: {{blockSize: {ns.block_size}}}
    kvEventsConfig: {{topicFilter: "kv@"}}
    syncCrossReplicaState: {spec_sync}
- type: inflight-load-producer
  parameters: {{prefixMatchInfoProducerName: precise-prefix-cache-producer, syncCrossReplicaState: {sync}}}
- type: prefix-cache-affinity-filter
  parameters:
    prefixMatchInfoProducerName: precise-prefix-cache-producer
    peakPrefillThroughput: {1.0 / ns.prefill_per_token:.0f}
    maxTTFTPenaltyMs: {ns.max_ttft_penalty_ms}
- type: token-load-scorer
- type: redis-cross-replica-syncer
  name: xr
  parameters: {{address: "{redis_url}", keyPrefix: "bench:{run}"}}
schedulingProfiles:
- name: default
  plugins: [{{pluginRef: prefix-cache-affinity-filter}}, {{pluginRef: token-load-scorer}}]
dataLayer: {{crossReplicaSyncerPluginRef: xr, crossReplicaSyncInterval: {interval or ns.sync_interval}}}
""" + endpoints_yaml(sims)


def split_mode(mode: str) -> tuple[str, str, str]:
    """`kind[:sync interval][@metrics refresh interval]` → (kind, sync interval or "", refresh interval or "")."""
    mode, _, refresh = mode.partition("@")
    kind, _, interval = mode.partition(":")
    return kind, interval, refresh


def paired_ratios(
    rows: Sequence[dict[str, object]], modes: Sequence[str], baseline: str = "1"
) -> dict[str, dict[str, list[float]]]:
    """Per mode other than `baseline`: TTFT p50/p90/p99 over the same repeat's `baseline` run (the one with the same
    metrics refresh interval, `@…`), as [median, min, max] over the repeats (a ratio taken between adjacent runs
    cancels most of the machine's drift)."""
    out: dict[str, dict[str, list[float]]] = {}
    for mode in modes:
        refresh = split_mode(mode)[2]
        base_mode = f"{baseline}@{refresh}" if refresh else baseline
        if mode == base_mode:
            continue
        base = {r["repeat"]: r for r in rows if r["mode"] == base_mode}
        per: dict[str, list[float]] = {}
        for r in rows:
            b = base.get(r["repeat"])
            if r["mode"] != mode or b is None:
                continue
            for k in ("ttft_p50", "ttft_p90", "ttft_p99"):
                per.setdefault(k, []).append(float(r[k]) / float(b[k]))  # type: ignore[arg-type]
        if per:
            out[mode] = {k: [statistics.median(v), min(v), max(v)] for k, v in per.items()}
    return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m e2e.bench.scale.replicas", description=__doc__.split("\n\n")[0])
    a = p.add_argument
    a("--pods", type=int, default=4)
    a(
        "--modes", default=",".join(DEFAULT_MODES),
        help=f"comma list of {', '.join(MODES)}; `mode:interval` (2-shared:10ms) overrides --sync-interval,"
        " `mode@interval` (1@1s) the replicas' --refresh-metrics-interval (the pods' scrape period)",
    )  # fmt: skip
    a("--repeats", type=int, default=3)
    a("--groups", type=int, default=16)
    a("--prompts-per-group", type=int, default=8)
    a("--system-len", type=int, default=1024)
    a("--question-len", type=int, default=64)
    a("--output-len", type=int, default=16)
    a("--rate", type=float, default=20.0)
    a("--requests", type=int, default=400)
    a("--seed", type=int, default=1)
    a("--block-size", type=int, default=16)
    a("--gpu-blocks", type=int, default=512)
    a("--max-num-seqs", type=int, default=4)
    a("--prefill-per-token", type=float, default=0.0005)
    a("--itl", type=float, default=0.005)
    a("--load-factor", type=float, default=2.0)
    a("--max-ttft-penalty-ms", type=float, default=1000.0)
    a("--sync-interval", default="100ms")
    a(
        "--time-scale", type=float, default=1.0,
        help="simulator time scale; arrivals are stretched by the same factor (2 = half the CPU per modelled second)",
    )  # fmt: skip
    a("--epp-args", default="", help="extra `epp serve` flags for every replica, e.g. '--refresh-metrics-interval 1s'")
    a("--quick", action="store_true")
    a("--workdir", default="", help="keep the EPP and Envoy logs here (default: a temporary directory)")
    a("--out", default="e2e/out/bench-replicas.json")
    ns = p.parse_args(argv)
    if ns.quick:
        ns.requests, ns.repeats = 150, 1
    return ns


def main(argv: Sequence[str] | None = None) -> int:
    ns = parse_args(argv)
    modes = [m.strip() for m in ns.modes.split(",") if m.strip()]
    workload = shared_prefix(
        num_groups=ns.groups, num_prompts_per_group=ns.prompts_per_group, system_prompt_len=ns.system_len,
        question_len=ns.question_len, output_len=ns.output_len, rate=ns.rate / ns.time_scale,
        num_requests=ns.requests, seed=ns.seed,
    )  # fmt: skip
    sim_args = [
        "--block-size", str(ns.block_size), "--num-gpu-blocks", str(ns.gpu_blocks),
        "--max-num-seqs", str(ns.max_num_seqs), "--prefill-time-per-token", str(ns.prefill_per_token),
        "--inter-token-latency", str(ns.itl), "--time-factor-under-load", str(ns.load_factor),
        "--prefill-overhead", "0.005", "--time-scale", str(ns.time_scale),
    ]  # fmt: skip
    print(f"workload {workload.name}: {len(workload.requests)} requests over {workload.duration:.0f}s")
    print(f"{ns.pods} simulated pods: {' '.join(sim_args)}")
    rows: list[dict[str, object]] = []
    per_run: list[tuple[str, dict[str, float]]] = []  # mode, the per-request checks and the TTFT split of one run
    run = 0
    with (
        tempfile.TemporaryDirectory(prefix="pyepp-replicas-") as tmp_default,
        redis_server() as url,
        start_simulators(ns.pods, base_args=sim_args, per_sim_args=lambda i: ["--seed", str(i)], timeout=300) as sims,
    ):
        pods = [f"sim-{s.http_port}" for s in sims]
        tmp = ns.workdir or tmp_default
        for rep in range(ns.repeats):
            for mode in modes if rep % 2 == 0 else modes[::-1]:  # ABBA: a drift in the machine's load cancels
                run += 1
                kind, _, refresh = split_mode(mode)
                epp_args = ns.epp_args.split() + (["--refresh-metrics-interval", refresh] if refresh else [])
                replicas = 1 if kind == "1" else 2
                serving = 1 if kind == "1+idle" else replicas
                workdir = Path(tmp) / f"run{run}"
                stack = start_replicas(
                    workdir, config(sims, url, mode, ns, run), replicas, serving=serving, extra_args=epp_args
                )
                try:
                    for _ in range(2 * serving):  # Envoy round-robins: every replica loads its tokenizer
                        warm_up(stack.url, str(workload.requests[0].body["model"]))
                    reset_caches(sims)
                    time.sleep(0.5)
                    groups = {f"epp{i}": [e.proc.pid] for i, e in enumerate(stack.epps)}
                    groups |= {"envoy": [stack.envoy.proc.pid], "sims": [s.proc.pid for s in sims]}
                    groups["bench"] = [os.getpid()]
                    cpu0 = cpu_snapshot(groups)
                    sim0 = sim_totals(sims)
                    progress = Progress(f"run {run}/{ns.repeats * len(modes)} {mode}", len(workload.requests))
                    results, duration = asyncio.run(
                        loadgen.run(stack.url, workload.requests, served_header=SERVED_HEADER, progress=progress)
                    )
                    cpu = {g: v - cpu0[g] for g, v in cpu_snapshot(groups).items()}
                    sim = {k: v - sim0[k] for k, v in sim_totals(sims).items()}
                    load1 = os.getloadavg()[0]
                    delivered = {"direction": "in", "result": "delivered"}
                    shared = sum(
                        metric_value(e.metrics_text(), "epp_cross_replica_messages_total", delivered, 0.0)
                        for e in stack.epps
                    )
                finally:
                    stack.close()
                s = loadgen.summarize(mode, results, duration, pods)
                total_cpu = sum(cpu.values())
                aff = affinity_trace.summary(workload.requests, results, ns.system_len, ns.max_num_seqs)
                row = {"mode": mode, "repeat": rep, **s.as_dict(), "cpu": cpu, "cpu_total": total_cpu, "load1": load1}
                row["affinity"] = aff
                row["shared_entries_received"] = shared
                n_sim = max(1.0, sim["ttft_count"])
                row["engine_ttft_mean"] = sim["ttft_sum"] / n_sim
                row["engine_queue_mean"] = sim["queue_sum"] / n_sim
                row["gateway_mean"] = s.ttft_mean - row["engine_ttft_mean"]
                per_run.append(
                    (
                        mode,
                        aff
                        | {
                            "split": aff["split_computing"] + aff["split_held"],
                            "engine_ttft_mean": row["engine_ttft_mean"],
                            "gateway_mean": row["gateway_mean"],
                        },
                    )
                )
                row["classes"] = affinity_trace.classify(workload.requests, results)
                row["per_request"] = [[r.served_by, r.ttft, r.e2e, r.cached_tokens] for r in results]
                rows.append(row)
                epp_cpu = "+".join(f"{cpu[g]:.1f}" for g in cpu if g.startswith("epp"))
                print(
                    f"  {mode:<14} rep {rep}: TTFT p50 {s.ttft_p50 * 1000:7.1f} ms  p90 {s.ttft_p90 * 1000:7.1f} ms"
                    f"  p99 {s.ttft_p99 * 1000:7.1f} ms  hit {s.kv_hit_rate:.3f}  cv {s.load_cv:.2f}  ok {s.ok}/{s.n}"
                    f"  CPU s: epp {epp_cpu} envoy {cpu['envoy']:.1f} sims {cpu['sims']:.1f} bench {cpu['bench']:.1f}"
                    f" (={total_cpu / duration:.2f} cores)  load {load1:.1f}\n"
                    f"  {'':<14}        where: "
                    + "  ".join(f"{k} {v:.3g}" for k, v in aff.items())
                    + f"  shared entries received {int(shared)}"
                    + f"  | TTFT mean {s.ttft_mean * 1000:.0f} ms = engine {row['engine_ttft_mean'] * 1000:.0f}"
                    f" (queue {row['engine_queue_mean'] * 1000:.0f}) + before it {row['gateway_mean'] * 1000:.0f}",
                    flush=True,
                )
    print("\nmedians over repeats")
    print(f"{'mode':<15}{'TTFT p50':>10}{'p90':>10}{'p99':>10}{'KV hit':>9}{'pod CV':>8}{'CPU s':>8}{'p90 / 1':>9}")
    med: dict[str, dict[str, float]] = {}
    for mode in modes:
        mine = [r for r in rows if r["mode"] == mode]
        med[mode] = {
            k: statistics.median(float(r[k]) for r in mine)  # type: ignore[arg-type]
            for k in ("ttft_p50", "ttft_p90", "ttft_p99", "kv_hit_rate", "load_cv", "cpu_total")
        }
    base = med.get("1", {}).get("ttft_p90")
    for mode, m in med.items():
        ratio = f"{m['ttft_p90'] / base:9.2f}" if base else f"{'-':>9}"
        print(
            f"{mode:<15}{m['ttft_p50'] * 1000:10.1f}{m['ttft_p90'] * 1000:10.1f}{m['ttft_p99'] * 1000:10.1f}"
            f"{m['kv_hit_rate']:9.3f}{m['load_cv']:8.2f}{m['cpu_total']:8.1f}{ratio}"
        )
    print(
        f"\n{'mode':<15}{'stuck':>7}{'split':>7}{'recomp':>8}{'busy':>6}{'engine ms':>11}{'before ms':>11}  (medians)"
    )
    for mode in modes:
        mine_aff = [a for m, a in per_run if m == mode]
        m_aff = {k: statistics.median(a[k] for a in mine_aff) for k in mine_aff[0]}
        med[mode] |= m_aff
        print(
            f"{mode:<15}{m_aff['stuck']:7.0f}{m_aff['split']:7.1f}{m_aff['recomputed']:8.1f}{m_aff['busy_mean']:6.2f}"
            f"{m_aff['engine_ttft_mean'] * 1000:11.0f}{m_aff['gateway_mean'] * 1000:11.0f}"
        )
    ratios: dict[str, dict[str, dict[str, list[float]]]] = {}
    for baseline in ("1", "1+idle"):
        ratios[baseline] = paired_ratios(rows, modes, baseline)
        if ratios[baseline]:
            print(f"\nper-repeat ratios to `{baseline}` (each against that run of its own repeat): median [min, max]")
        for mode, r in ratios[baseline].items():
            print(f"{mode:<15}" + "  ".join(f"{k[5:]} {v[0]:.2f} [{v[1]:.2f}, {v[2]:.2f}]" for k, v in r.items()))
    out = Path(ns.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(ns), "runs": rows, "medians": med, "ratios": ratios}, indent=1))
    print(f"\nwrote {out}")
    failed = sum(int(r["n"]) - int(r["ok"]) for r in rows)  # type: ignore[call-overload]
    if failed:
        print(f"{failed} requests failed", file=sys.stderr)
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
