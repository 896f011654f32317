"""Micro-benchmark of one scheduling cycle: 16 and 256 endpoints, an 8k-token chat prompt.

Variants, measured side by side in one run:
- `load`    : queue-scorer x2 + kv-cache-utilization-scorer x2 + max-score-picker (no prefix scoring);
- `prefix`  : GIE's default (the above + prefix-cache-scorer x3), including the approximate producer's work
              (hash the prompt once, match it against the index) — 256 blocks x 16 tokens, GIE's default;
- `prefix-full`: the same with the whole 8k prompt hashed (maxPrefixBlocksToMatch 2048, llm-d's default);
- `prefix-timed`: `prefix` with per-plugin latency metrics on every cycle (default: 1 cycle in 16);
- `pyepp-default`: config/pyepp-default.yaml as shipped (token-producer → precise-prefix-cache-producer →
              prefill-cost-scorer → max-score-picker; the tokenizer's cache is warm, the KV index holds the
              speculative entries of earlier picks, as no engine publishes events here).
Each variant is timed as `schedule` (producer prepare + Scheduler.schedule, the per-request CPU the goal is
about) and as `director` (the whole SchedulingDirector.handle_request incl. admission and PreRequest hooks).
The prefix index is warm: every measured request shares a 2k-token system prompt with earlier ones, and
earlier picks are recorded in PreRequest as in production.

    python -m e2e.bench.components.scheduler [--iterations N]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from epp.config import parse_config
from epp.datalayer.datastore import Datastore
from epp.framework import ApiKind, Endpoint, InferenceRequest, Metrics
from epp.requestcontrol.director import SchedulingDirector
from epp.wiring import plugin_context
from epp.wiring.builder import build_pipeline

LOAD = """
plugins: [{type: queue-scorer}, {type: kv-cache-utilization-scorer}, {type: max-score-picker}]
schedulingProfiles:
- name: default
  plugins: [{pluginRef: queue-scorer, weight: 2}, {pluginRef: kv-cache-utilization-scorer, weight: 2}]
"""
# GIE's default (config/gie-default.yaml's plugins): queue 2, kv 2, prefix 3. Not "{}": a config without plugins is
# pyepp's own default now (issue 11), which `pyepp-default` measures.
GIE_PROFILE = """
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: queue-scorer, weight: 2}
  - {pluginRef: kv-cache-utilization-scorer, weight: 2}
  - {pluginRef: prefix-cache-scorer, weight: 3}
"""
PREFIX = (
    """
plugins:
- {type: queue-scorer}
- {type: kv-cache-utilization-scorer}
- {type: prefix-cache-scorer}
- {type: max-score-picker}
"""
    + GIE_PROFILE
)
PREFIX_FULL = (
    """
plugins:
- {type: queue-scorer}
- {type: kv-cache-utilization-scorer}
- {type: approx-prefix-cache-producer, parameters: {maxPrefixBlocksToMatch: 2048}}
- {type: prefix-cache-scorer, parameters: {prefixMatchInfoProducerName: approx-prefix-cache-producer}}
"""
    + GIE_PROFILE
)
PYEPP_DEFAULT = (Path(__file__).resolve().parents[3] / "config" / "pyepp-default.yaml").read_text()
VARIANTS = {
    "load": LOAD,
    "prefix": PREFIX,
    "prefix-full": PREFIX_FULL,
    "prefix-timed": PREFIX,
    "pyepp-default": PYEPP_DEFAULT,
}
# Per-plugin latency histograms: sampled 1 cycle in 16 by default; "prefix-timed" times every cycle.
TIMING_EVERY = {"prefix-timed": 1}


def make_prompts(n: int, tokens: int = 8192, shared: int = 2048) -> list[str]:
    """n chat prompts of exactly `tokens` Qwen2.5 tokens sharing a `shared`-token system prefix."""
    from epp.tokenization.qwen import load_qwen25_tokenizer

    tok = load_qwen25_tokenizer()
    rnd = random.Random(0)
    vocab = [i for i in range(1000, 100000)]

    def text(k: int) -> str:
        ids = rnd.sample(vocab, k)
        s: str = tok.decode(ids)
        # re-tokenization may merge/split a little: trim or pad to the exact count
        enc = tok.encode(s, add_special_tokens=False)
        while len(enc) < k:
            s += " x"
            enc = tok.encode(s, add_special_tokens=False)
        return str(tok.decode(enc[:k]))

    system = text(shared)
    return [system + text(tokens - shared) for _ in range(n)]


def pool(n: int) -> Datastore:
    rnd = random.Random(n)
    ds = Datastore()
    eps = []
    for i in range(n):
        e = Endpoint(f"pod-{i}", f"10.{i // 250}.{i % 250}.1", 8000)
        e.metrics = Metrics(
            waiting_queue_size=rnd.randint(0, 8),
            running_requests_size=rnd.randint(0, 32),
            kv_cache_usage_percent=rnd.random() * 0.7,
            update_time=time.monotonic() + 3600,  # stays fresh for the whole run
        )
        eps.append(e)
    ds.replace_all(eps)
    return ds


def request(i: int, prompt: str) -> InferenceRequest:
    msgs = [{"role": "user", "content": prompt}]
    return InferenceRequest(
        f"req-{i}",
        "/v1/chat/completions",
        ApiKind.CHAT,
        "qwen",
        "qwen",
        {"model": "qwen", "messages": msgs},
        messages=msgs,
    )


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def measure(variant: str, n_endpoints: int, prompts: list[str], iterations: int) -> dict[str, list[float]]:
    ds = pool(n_endpoints)
    pipeline = build_pipeline(parse_config(VARIANTS[variant]), plugin_context(ds))
    pipeline.scheduler.plugin_timing_every = TIMING_EVERY.get(variant, 16)
    director = SchedulingDirector(ds, pipeline)
    producers = pipeline.producers
    scheduler = pipeline.scheduler
    candidates = list(ds.endpoints())
    # warm the prefix index with earlier requests (as production would have)
    for i in range(64):
        await director.handle_request(request(-i, prompts[i % len(prompts)]))
        await asyncio.sleep(0)
    sched_us: list[float] = []
    director_us: list[float] = []
    gc.collect()
    gc.disable()
    try:
        for i in range(iterations):
            prompt = prompts[i % len(prompts)]
            r = request(i, prompt)
            t0 = time.perf_counter_ns()
            for p in producers:
                await p.prepare(r, candidates)
            scheduler.schedule(r, candidates)
            sched_us.append((time.perf_counter_ns() - t0) / 1000)
            r = request(i, prompt)
            t0 = time.perf_counter_ns()
            await director.handle_request(r)
            director_us.append((time.perf_counter_ns() - t0) / 1000)
            await asyncio.sleep(0)  # let the deferred PreRequest index update run (not on the timed path)
    finally:
        gc.enable()
    return {"schedule": sched_us, "director": director_us}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=2000)
    ap.add_argument("--endpoints", default="16,256", help="comma list of pool sizes, e.g. 8,64,512")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma list of {', '.join(VARIANTS)}")
    args = ap.parse_args(argv)
    variants = args.variants.split(",")
    sizes = [int(x) for x in args.endpoints.split(",")]
    prompts = make_prompts(16)
    print(f"\n8k-token prompts: {len(prompts)} x ~{len(prompts[0])} chars; {args.iterations} cycles per cell")
    results: dict[tuple[str, int], dict[str, list[float]]] = {}
    for n in sizes:
        for v in variants:
            results[(v, n)] = asyncio.run(measure(v, n, prompts, args.iterations))
    print(f"{'variant':<12} {'endpoints':>9} {'what':<9} {'p50 µs':>8} {'p90 µs':>8}")
    for (v, n), res in results.items():
        for what, xs in res.items():
            print(f"{v:<12} {n:>9} {what:<9} {statistics.median(xs):>8.1f} {pct(xs, 0.9):>8.1f}")
    med: Callable[[str, int, str], float] = lambda v, n, w: statistics.median(results[(v, n)][w])  # noqa: E731
    print("ratios (p50):")
    for n in sizes:
        if {"prefix", "load"} <= set(variants):
            print(f"  {n:>3} endpoints: prefix/load = {med('prefix', n, 'schedule') / med('load', n, 'schedule'):.2f}")
        if {"prefix", "prefix-timed"} <= set(variants):
            timed = med("prefix-timed", n, "schedule") / med("prefix", n, "schedule")
            print(f"  {n:>3} endpoints: timing every plugin of every cycle / sampled = {timed:.2f}")
    for v in variants:
        lo, hi = sizes[0], sizes[-1]
        print(f"  {v:<12}: {hi}/{lo} endpoints = {med(v, hi, 'schedule') / med(v, lo, 'schedule'):.2f}")
    for v, limit in (("load", 200.0), ("prefix", 500.0), ("pyepp-default", 300.0)):
        if v not in variants:
            continue
        worst = max(med(v, n, "schedule") for n in sizes)
        verdict = "met" if worst <= limit else "MISSED"
        print(f"goal {v}: p50 {worst:.1f} µs (worst of {args.endpoints}) vs {limit:.0f} µs → {verdict}")


if __name__ == "__main__":
    main()
