"""HA, active-active: two EPP replicas subscribe to the same pods' KV events and route alike.

Replica B never sees the requests that warm the caches (they go through replica A's Envoy), yet it sends
each prefix to the pod that holds it, because it learned the blocks from the pods' events; and both replicas
give the same pick for the same prompt.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.harness.http import metric_value, post_json
from e2e.harness.stack import Stack, start_stack
from e2e.sim.launch import SimProcess, start_simulators
from e2e.test_kv_routing import config
from e2e.workloads.text import TextFactory
from epp.tokenization.qwen import QWEN25_MODEL

pytestmark = pytest.mark.e2e


@pytest.fixture
def two_replicas(tmp_path: Path) -> Iterator[tuple[Stack, Stack, list[SimProcess]]]:
    with start_simulators(4, base_args=["--block-size", "16", "--model", QWEN25_MODEL]) as sims:
        (tmp_path / "a").mkdir()
        (tmp_path / "b").mkdir()
        a = start_stack(tmp_path / "a", backends=[], config=config(sims))
        try:
            b = start_stack(tmp_path / "b", backends=[], config=config(sims))
            try:
                yield a, b, sims
            finally:
                b.close()
        finally:
            a.close()


def _pod(stack: Stack, prompt: str) -> str:
    r = post_json(stack.url + "/v1/completions", {"model": QWEN25_MODEL, "prompt": prompt, "max_tokens": 1})
    assert r.status == 200, r.body
    return r.headers["x-inference-pod"]


def _stored(stack: Stack) -> float:
    return metric_value(stack.epp.metrics_text(), "kv_cache_events_blocks_total", {"op": "stored"})


def test_replicas_agree_from_events_alone(two_replicas: tuple[Stack, Stack, list[SimProcess]]) -> None:
    a, b, _ = two_replicas
    texts = TextFactory(11)
    prefixes = [texts.text(("ha", i), 512) for i in range(6)]
    home = {i: _pod(a, p + texts.text(("q", i), 16)) for i, p in enumerate(prefixes)}  # warm through A only
    assert len(set(home.values())) > 1  # the prefixes landed on different pods
    # B sends nothing until it has applied what A's requests stored (6 prompts × 33 full blocks)
    deadline = time.monotonic() + 10
    while not _stored(a) == _stored(b) >= 6 * 33 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _stored(a) == _stored(b) >= 6 * 33  # both replicas ingested the same events
    picks_b = {i: _pod(b, p + texts.text(("q2", i), 16)) for i, p in enumerate(prefixes)}
    assert picks_b == home
    # same state, same prompt → same pick on both replicas
    for i, p in enumerate(prefixes):
        prompt = p + texts.text(("q3", i), 16)
        assert _pod(a, prompt) == _pod(b, prompt) == home[i]
