"""The closed loop on delivered hits when responses carry no cached_tokens: the EPP compares what its index predicted
with the engine's prefix-cache counters (`vllm:prefix_cache_queries_total` / `vllm:prefix_cache_hits_total`, read
from the scrape it already does).

Same shape as e2e/test_delivered_hits.py (Envoy + EPP with the precise producer + 4 simulators), but the simulators
answer without `prompt_tokens_details` (vLLM without `--enable-prompt-tokens-details`) and the clients stream without
`stream_options.include_usage`, so the EPP sees no usage at all. Pod 0 serves all 16 prompt groups while it silently
loses a share of its BlockRemoved events, so the index believes it holds prefixes it evicted. Through the gateway,
the counters show pod 0 delivering far fewer hits than predicted; its entries are cleared (counted) and the groups
spread again. The KV hit is measured from the simulators' own counters (the clients see none).
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.harness.http import metric_value, post_json, request, sse_events
from e2e.harness.stack import start_stack
from e2e.sim.launch import SimProcess, start_simulators
from e2e.test_delivered_hits import GROUPS, WINDOW, config, prefix, set_drop
from epp.tokenization.qwen import QWEN25_MODEL

pytestmark = pytest.mark.e2e

DROP_SHARE = 0.8  # of pod 0's BlockRemoved events while it serves every group


def counters(sims: list[SimProcess]) -> tuple[float, float]:
    """(prefix-cache hits, queries) summed over the simulators."""
    hits = queries = 0.0
    for s in sims:
        text = request(s.url + "/metrics").body.decode()
        hits += metric_value(text, "vllm:prefix_cache_hits_total", default=0.0)
        queries += metric_value(text, "vllm:prefix_cache_queries_total", default=0.0)
    return hits, queries


def ask(url: str, g: int, i: int) -> None:
    body = {"model": QWEN25_MODEL, "prompt": prefix(g) + f" Question {i}?", "max_tokens": 2, "stream": True}
    r = post_json(url + "/v1/completions", body)
    assert r.status == 200, r.body
    events = sse_events(r.body)
    assert events[-1] == "[DONE]" and not any(isinstance(e, dict) and e.get("usage") for e in events)


@pytest.fixture
def sims() -> Iterator[list[SimProcess]]:
    args = ["--block-size", "16", "--model", QWEN25_MODEL, "--num-gpu-blocks", "100", "--seed", "3"]
    args += ["--kv-events-drop-types", "BlockRemoved", "--no-prompt-tokens-details"]
    with start_simulators(4, base_args=args, timeout=300.0) as s:  # slow to start on a loaded box
        yield s


def run(tmp_path: Path, sims: list[SimProcess], feedback: bool, n: int = 100) -> tuple[float, int | None]:
    """KV hit of the last half of `n` gateway requests (from the engines' counters) and the request at which pod 0
    was first resynced (None: never)."""
    for s in sims:
        set_drop([s], 0.0)
        assert post_json(s.url + "/reset_prefix_cache", {}).status == 200
    tmp_path.mkdir(parents=True, exist_ok=True)
    stack = start_stack(tmp_path, backends=[], config=config(sims, feedback))
    try:
        set_drop(sims[:1], DROP_SHARE)
        for rnd in range(2):
            for g in range(GROUPS):
                body = {"model": QWEN25_MODEL, "prompt": prefix(g) + f" Question {rnd}?", "max_tokens": 2}
                r = post_json(sims[0].url + "/v1/completions", body)
                assert r.status == 200, r.body
        time.sleep(0.5)
        set_drop(sims[:1], 0.0)
        rng = random.Random(11)
        first_resync: int | None = None
        pod0 = {"pod": f"{sims[0].host}:{sims[0].http_port}"}
        start = counters(sims)
        for i in range(n):
            if i == n // 2:
                start = counters(sims)
            ask(stack.url, rng.randrange(GROUPS), 100 + i)
            if first_resync is None and feedback:
                text = stack.epp.metrics_text()
                if metric_value(text, "kv_cache_delivered_hits_resyncs_total", pod0, default=0.0) > 0:
                    first_resync = i
                    compared = metric_value(text, "kv_cache_delivered_hits_counter_intervals_total", pod0)
                    assert compared > 0  # the counters decided, not usage (there is none)
        hits, queries = counters(sims)
        text = stack.epp.metrics_text()
        resyncs = [
            metric_value(text, "kv_cache_delivered_hits_resyncs_total", {"pod": f"{s.host}:{s.http_port}"}, 0.0)
            for s in sims
        ]
        print(f"feedback {feedback}: resyncs per pod {resyncs}")
        assert resyncs[1:] == [0.0, 0.0, 0.0]  # the pods that announce their evictions are never cleared
        return (hits - start[0]) / (queries - start[1]), first_resync
    finally:
        stack.close()


@pytest.mark.timeout(900)  # two stacks of 100 requests each; the shared box can be slow
def test_lost_kv_events_are_repaired_from_engine_counters(tmp_path: Path, sims: list[SimProcess]) -> None:
    off, never = run(tmp_path / "off", sims, feedback=False)
    on, first = run(tmp_path / "on", sims, feedback=True)
    print(f"KV hit of the last 50 requests (engine counters): loop off {off:.3f}, on {on:.3f}; first resync at {first}")
    assert never is None
    assert off < 0.35  # the stale entries stay: the groups keep going to pod 0, which evicted most of them
    # The counters close an interval per scrape (50 ms); a window of 8 predicted-hit requests, then the decision.
    assert first is not None and first <= 4 * WINDOW
    assert on >= 0.6 and on >= off + 0.3
