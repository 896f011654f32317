"""The closed loop on delivered hits, end to end: Envoy + EPP (precise producer fed by KV events) + 4 simulators,
one of which silently loses its KV events (`--kv-events-drop-rate` with `--kv-events-drop-types BlockRemoved`:
lost before numbering, so no sequence gap and nothing a replay could recover; an engine whose evictions go
unannounced).

Pod 0 serves all 16 prompt groups while its evictions go unannounced, so the index believes it holds every
group's long prefix; it holds the last 3 or so (its KV cache is small). Then the loss stops and traffic goes
through the gateway. Without the loop every group keeps going to pod 0 (the only pod the index knows to hold it)
and misses; with it, pod 0's delivered hits fall short of the predicted ones for a window of requests, its entries
are cleared (counted), and the groups spread over the four pods: KV hit measured before/after.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.harness.http import metric_value, post_json
from e2e.harness.simconfig import sim_endpoints_yaml
from e2e.harness.stack import start_stack
from e2e.sim.launch import SimProcess, start_simulators
from epp.tokenization.qwen import QWEN25_MODEL

pytestmark = pytest.mark.e2e

GROUPS = 16
WINDOW = 8


def prefix(g: int) -> str:
    return f"Group {g} brief. " + " ".join(f"Item {g}-{i}: keep the records of group {g} in order." for i in range(30))


def config(sims: list[SimProcess], feedback: bool) -> str:
    lines = [
        "plugins:",
        "  - type: precise-prefix-cache-producer",
        "    name: kv",
        "    parameters:",
        "      tokenProcessorConfig: {blockSize: 16, hashSeed: '7'}",
        "      kvEventsConfig: {topicFilter: 'kv@', concurrency: 2}",
        "      speculativeIndexing: false",
        f"      deliveredHitsConfig: {{enabled: {str(feedback).lower()}, window: {WINDOW}, maxShortfall: 0.5}}",
        "  - type: prefix-cache-scorer",
        "    parameters: {prefixMatchInfoProducerName: kv}",
        "  - type: max-score-picker",
        "schedulingProfiles:",
        "  - name: default",
        "    plugins: [{pluginRef: prefix-cache-scorer, weight: 1}, {pluginRef: max-score-picker}]",
    ]
    return "\n".join(lines) + "\n" + sim_endpoints_yaml(sims)


def ask(url: str, g: int, i: int) -> tuple[int, int]:
    body = {"model": QWEN25_MODEL, "prompt": prefix(g) + f" Question {i}?", "max_tokens": 2}
    r = post_json(url + "/v1/completions", body)
    assert r.status == 200, r.body
    usage = r.json()["usage"]
    return usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"]


def set_drop(sims: list[SimProcess], rate: float) -> None:
    for s in sims:
        r = post_json(s.url + "/admin/config", {"kv_events_drop_rate": rate})
        assert r.status == 200, r.body


@pytest.fixture
def sims() -> Iterator[list[SimProcess]]:
    # ~470-token prefixes (30 blocks); 100 blocks per pod: about 3 prefixes each, 16 groups over 4 pods
    args = ["--block-size", "16", "--model", QWEN25_MODEL, "--num-gpu-blocks", "100", "--seed", "3"]
    args += ["--kv-events-drop-types", "BlockRemoved"]  # when losing: evictions the engine never announces
    with start_simulators(4, base_args=args, timeout=180.0) as s:
        yield s


def run(tmp_path: Path, sims: list[SimProcess], feedback: bool, n: int = 160) -> tuple[list[float], int | None]:
    """Per gateway request: the share of its prompt the engine served from cache; and the request at which the
    first resync happened (None: never)."""
    for s in sims:  # a clean start: empty caches (announced), no loss
        set_drop([s], 0.0)
        assert post_json(s.url + "/reset_prefix_cache", {}).status == 200
    tmp_path.mkdir(parents=True, exist_ok=True)
    stack = start_stack(tmp_path, backends=[], config=config(sims, feedback))
    try:
        # Pod 0 serves every group directly (not through the gateway) while it announces no eviction: the index
        # now says pod 0 holds all 16 prefixes; it holds the last 3 or so.
        set_drop(sims[:1], 1.0)
        for rnd in range(2):
            for g in range(GROUPS):
                ask(sims[0].url, g, rnd)
        time.sleep(0.5)  # the events reach the index
        set_drop(sims[:1], 0.0)
        rng = random.Random(11)
        hits: list[float] = []
        first_resync: int | None = None
        for i in range(n):
            prompt, cached = ask(stack.url, rng.randrange(GROUPS), 100 + i)
            hits.append(cached / prompt)
            if first_resync is None and feedback:
                text = stack.epp.metrics_text()
                pod0 = {"pod": f"{sims[0].host}:{sims[0].http_port}"}
                if metric_value(text, "kv_cache_delivered_hits_resyncs_total", pod0, default=0.0) > 0:
                    first_resync = i
        return hits, first_resync
    finally:
        stack.close()


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def test_lost_kv_events_are_detected_and_repaired(tmp_path: Path, sims: list[SimProcess]) -> None:
    off, never = run(tmp_path / "off", sims, feedback=False)
    on, first = run(tmp_path / "on", sims, feedback=True)
    print(
        f"KV hit (share of prompt tokens served from cache) first 40 / last 80 requests: "
        f"loop off {mean(off[:40]):.3f} / {mean(off[-80:]):.3f}, on {mean(on[:40]):.3f} / {mean(on[-80:]):.3f}; "
        f"first resync at request {first}"
    )
    assert never is None
    # Without the loop the stale entries stay: every group is still sent to pod 0, which holds ~3 of the 16.
    assert mean(off[-80:]) < 0.35
    # With it, pod 0's shortfall is seen within a window of requests, its entries are cleared, and the groups
    # spread over the four pods again (a clean start reaches ~0.7 on this workload).
    assert first is not None and first <= 3 * WINDOW
    assert mean(on[-80:]) >= 0.6 and mean(on[-80:]) >= mean(off[-80:]) + 0.3
