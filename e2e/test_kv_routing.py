"""Envoy + EPP (precise-prefix-cache-scorer fed by KV events) + 4 simulators publishing vLLM events.

A repeated long prefix keeps going to the pod whose KV cache holds it; after that pod's prefix cache is
reset (AllBlocksCleared), routing moves to the pod holding the next-longest prefix.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.harness.http import metric_value, post_json
from e2e.harness.simconfig import sim_endpoints_yaml
from e2e.harness.stack import Stack, start_stack
from e2e.sim.launch import SimProcess, start_simulators
from epp.tokenization.qwen import QWEN25_MODEL

pytestmark = pytest.mark.e2e

PREFIX = "You are reviewing a long contract. " + " ".join(
    f"Clause {i}: the supplier shall deliver the goods in good order and condition." for i in range(80)
)


def config(sims: list[SimProcess]) -> str:
    lines = [
        "plugins:",
        "  - type: precise-prefix-cache-scorer",
        "    parameters:",
        "      tokenProcessorConfig: {blockSize: 16, hashSeed: '7'}",
        "      kvEventsConfig: {topicFilter: 'kv@', concurrency: 2}",
        "      speculativeIndexing: true",
        "      speculativeTTL: 300ms",
        "  - type: max-score-picker",
        "schedulingProfiles:",
        "  - name: default",
        "    plugins: [{pluginRef: precise-prefix-cache-scorer, weight: 1}, {pluginRef: max-score-picker}]",
    ]
    return "\n".join(lines) + "\n" + sim_endpoints_yaml(sims)


@pytest.fixture
def kv_stack(tmp_path: Path) -> Iterator[tuple[Stack, list[SimProcess]]]:
    with start_simulators(4, base_args=["--block-size", "16", "--model", QWEN25_MODEL]) as sims:
        stack = start_stack(tmp_path, backends=[], config=config(sims))
        try:
            yield stack, sims
        finally:
            stack.close()


def complete(url: str, prompt: str) -> tuple[int, int]:
    """(port of the simulator that served it, cached prompt tokens it reported)."""
    r = post_json(url + "/v1/completions", {"model": QWEN25_MODEL, "prompt": prompt, "max_tokens": 2})
    assert r.status == 200, r.body
    return int(r.headers["x-inference-port"]), int(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])


def wait_metric(stack: Stack, name: str, labels: dict[str, str], at_least: float, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while metric_value(stack.epp.metrics_text(), name, labels) < at_least:
        assert time.monotonic() < deadline, f"{name}{labels} never reached {at_least}"
        time.sleep(0.05)


def test_long_prefix_follows_the_cache_and_moves_after_reset(kv_stack: tuple[Stack, list[SimProcess]]) -> None:
    stack, sims = kv_stack
    by_port = {s.http_port: s for s in sims}
    first, _ = complete(stack.url, PREFIX + " Question 0: who pays shipping?")
    owner = by_port[first]
    # another pod gets (directly, not through the gateway) a request sharing the first part of the prefix
    runner_up = next(s for s in sims if s is not owner)
    complete(runner_up.url, PREFIX[: len(PREFIX) // 2])
    wait_metric(stack, "kv_cache_events_blocks_total", {"op": "stored"}, 2)
    time.sleep(0.4)  # past the speculative TTL: from now on only real KV events count
    for i in range(1, 5):
        port, cached = complete(stack.url, PREFIX + f" Question {i}: what about damages?")
        assert port == owner.http_port
        assert cached > 1000  # the engine really reused the prefix
    cleared = metric_value(stack.epp.metrics_text(), "kv_cache_events_blocks_total", {"op": "cleared"})
    assert cleared == 0
    r = post_json(owner.url + "/reset_prefix_cache", {})
    assert r.status == 200, r.body
    wait_metric(stack, "kv_cache_events_blocks_total", {"op": "cleared"}, cleared + 1)
    time.sleep(0.4)
    port, cached = complete(stack.url, PREFIX + " Question 9: and termination?")
    assert port == runner_up.http_port
    assert cached > 0
