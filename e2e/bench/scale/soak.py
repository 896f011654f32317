"""Memory growth under a long run: the EPP (precise chain, KV events from 4 simulators) serves a stream of
ever-new prompts (a new shared prefix every few requests, so the KV index keeps receiving new blocks) and
its RSS is sampled from its own /metrics (`process_resident_memory_bytes`), and so is the size of that page.
`--hostile-models N` also sends N requests per window with a never-seen model name each (a client probing for
label cardinality): RSS and the /metrics page must stay flat all the same (names past the bound count as
`__other__`).

    python -m e2e.bench.scale.soak --minutes 3 --rate 20 [--hostile-models 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from e2e.bench import loadgen
from e2e.harness.http import metric_value, request
from e2e.harness.stack import start_stack
from e2e.sim.launch import start_simulators
from e2e.strategies import config_text
from e2e.workloads.shared_prefix import shared_prefix


def scrape(url: str) -> dict[str, float]:
    text = request(url).body.decode()
    blocks = "kv_cache_events_blocks_total"
    return {
        "metrics_bytes": float(len(text)),
        "process_resident_memory_bytes": metric_value(text, "process_resident_memory_bytes"),
        "blocks_stored": metric_value(text, blocks, {"op": "stored"}, default=0.0),
        "blocks_removed": metric_value(text, blocks, {"op": "removed"}, default=0.0),
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m e2e.bench.scale.soak")
    p.add_argument("--minutes", type=float, default=3.0)
    p.add_argument("--rate", type=float, default=20.0)
    p.add_argument("--window", type=float, default=20.0, help="seconds per workload window (fresh prefixes each)")
    p.add_argument("--json", help="write the samples here")
    p.add_argument("--hostile-models", type=int, default=0, help="requests per window with a new model name each")
    ns = p.parse_args(argv)
    samples = []
    sim_args = ["--prefill-time-per-token", "0.00005", "--inter-token-latency", "0.002", "--num-gpu-blocks", "4096",
                "--max-num-seqs", "64"]  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="pyepp-soak-") as tmp, start_simulators(4, base_args=sim_args) as sims:
        stack = start_stack(
            Path(tmp), backends=[], config=config_text("precise", sims), epp_args=["--log-level", "warning"]
        )
        try:
            start = time.monotonic()
            window = 0
            total = 0
            while time.monotonic() - start < ns.minutes * 60:
                n = int(ns.rate * ns.window)
                w = shared_prefix(
                    num_groups=max(1, n // 4), num_prompts_per_group=4, system_prompt_len=512, question_len=64,
                    output_len=4, rate=ns.rate, num_requests=n, seed=1000 + window,
                )  # fmt: skip
                results, _ = asyncio.run(loadgen.run(stack.url, w.requests, served_header="x-inference-pod"))
                total += len(results)
                failed = sum(1 for r in results if r.status != 200)
                for i in range(ns.hostile_models):
                    body = {"model": f"probe-{window}-{i}-\ud800", "prompt": "x", "max_tokens": 1}
                    request(stack.url + "/v1/completions", "POST", json.dumps(body).encode(),
                            {"content-type": "application/json"})  # fmt: skip
                m = scrape(stack.epp.metrics_url)
                sample = {"t": round(time.monotonic() - start, 1), "requests": total, "failed": failed, **m}
                samples.append(sample)
                rss = m.get("process_resident_memory_bytes", 0) / 2**20
                print(f"t={sample['t']:>6}s requests={total:>6} failed={failed} rss={rss:7.1f} MiB "
                      f"/metrics={m['metrics_bytes'] / 1024:7.1f} KiB "
                      f"blocks stored={m.get('blocks_stored', 0):.0f} removed={m.get('blocks_removed', 0):.0f}",
                      flush=True)  # fmt: skip
                window += 1
        finally:
            stack.close()
    if len(samples) >= 3:
        first, last = samples[1], samples[-1]  # after the first window (imports, tokenizer, caches warm)
        growth = (last["process_resident_memory_bytes"] - first["process_resident_memory_bytes"]) / 2**20
        per_k = growth * 1000 / max(1, last["requests"] - first["requests"])
        print(f"RSS growth after warm-up: {growth:+.1f} MiB over {last['requests'] - first['requests']} requests "
              f"({per_k:+.2f} MiB per 1k requests)")  # fmt: skip
        # once the engines' caches are full, stores and removals balance and the index stops growing
        half = samples[len(samples) // 2]
        steady = (last["process_resident_memory_bytes"] - half["process_resident_memory_bytes"]) / 2**20
        print(f"second half: {steady:+.1f} MiB over {last['requests'] - half['requests']} requests")
    if ns.json:
        Path(ns.json).write_text(json.dumps(samples, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
