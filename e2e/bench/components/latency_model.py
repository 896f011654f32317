"""Micro-benchmark of predicted-latency-producer's per-request work: predictions for every candidate (prepare) and
learning one TTFT sample, at 16 and 64 endpoints, with warm models (per-endpoint and pooled).

    python -m e2e.bench.components.latency_model [--iterations N]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time

import numpy as np

from epp.datalayer.datastore import Datastore
from epp.framework import (
    PREFIX_CACHE_MATCH_INFO,
    TOKENIZED_PROMPT,
    ApiKind,
    Endpoint,
    InferenceRequest,
    Metrics,
    Params,
    PrefixCacheMatchInfo,
    TokenizedPrompt,
)
from epp.plugins.producers.predicted_latency_producer import PredictedLatencyProducer
from epp.wiring import plugin_context

PREFIX = PREFIX_CACHE_MATCH_INFO.of("approx-prefix-cache-producer")


def request(rid: str, prompt: int, matches: dict[str, float]) -> InferenceRequest:
    req = InferenceRequest(rid, "/v1/completions", ApiKind.COMPLETIONS, "m", "m", {}, stream=True)
    req.data.put(TOKENIZED_PROMPT, TokenizedPrompt(list(range(prompt))))
    req.data.put(PREFIX, PrefixCacheMatchInfo(prompt // 16, 16, matches))
    return req


async def bench(n_endpoints: int, iterations: int) -> tuple[float, float]:
    eps = [Endpoint(f"pod-{i}", f"10.0.{i // 250}.{i % 250 + 1}", 8000) for i in range(n_endpoints)]
    for ep in eps:
        ep.metrics = Metrics(update_time=time.monotonic(), running_requests_size=2, kv_cache_usage_percent=0.3)
    prod = PredictedLatencyProducer.from_config(
        "predicted-latency-producer", Params("p", {"streamingMode": True}), plugin_context(Datastore())
    )
    rng = random.Random(1)
    for ep in eps:  # warm models: 40 samples per endpoint
        for _ in range(40):
            x = np.array([1.0, rng.uniform(0, 4), rng.uniform(0, 4), rng.randint(0, 8), rng.randint(0, 3), 0.3])
            prod.ttft.observe(ep.name, x, float(x @ [20, 150, 60, 8, 10, 5]))
            prod.tpot.observe(ep.name, x[[0, 3, 5, 2]], float(4 + 1.5 * x[3]))
    prepare, learn = [], []
    x = np.array([1.0, 1.0, 0.5, 2, 0, 0.3])
    for i in range(iterations):
        req = request(f"r{i}", 2000, {eps[i % n_endpoints].name: 60.0})
        t0 = time.perf_counter()
        await prod.prepare(req, eps)
        t1 = time.perf_counter()
        prod.ttft.observe(eps[i % n_endpoints].name, x, 200.0)
        t2 = time.perf_counter()
        prepare.append(t1 - t0)
        learn.append(t2 - t1)
    return statistics.median(prepare) * 1e6, statistics.median(learn) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=2000)
    args = ap.parse_args()
    for n in (16, 64):
        p, lr = asyncio.run(bench(n, args.iterations))
        print(
            f"{n:3d} endpoints: prepare (predict TTFT+TPOT for all) median {p:7.1f} us; learn one sample {lr:5.1f} us"
        )


if __name__ == "__main__":
    main()
