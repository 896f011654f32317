"""Pick logs from a real Envoy and EPP: the access log carries every pick with its replay index and the EPP's
per-endpoint totals (`--emit-endpoint-scores`), the EPP's trace log each scorer's score, and the two join."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from e2e.bench import loadgen
from e2e.harness import picklog
from e2e.harness.stack import Stack
from e2e.workloads.base import Request

pytestmark = pytest.mark.e2e

CHAIN = """plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: queue-scorer, weight: 1}
  - {pluginRef: kv-cache-utilization-scorer, weight: 2}
  - {pluginRef: max-score-picker}
"""


def test_every_pick_is_logged_with_its_scores_and_terms(stack_factory: Callable[..., Stack], tmp_path: Path) -> None:
    log = tmp_path / "picks.access.log"

    def config(backends: list[object]) -> str:
        eps = "".join(f"  - {{name: {b.name}, address: {b.host}, port: {b.port}}}\n" for b in backends)  # type: ignore[attr-defined]
        return CHAIN + "endpoints:\n" + eps

    stack = stack_factory(
        backends=3,
        config=config,
        epp_args=["--emit-endpoint-scores", "--v", "5"],
        epp_log_level="",
        envoy_overrides={"pick_log": str(log)},
    )
    reqs = [
        Request(
            arrival=0.05 * i,
            api="completions",
            body={"model": "m", "prompt": f"hello {i}", "max_tokens": 2, "stream": True},
        )
        for i in range(6)
    ]
    results, _ = asyncio.run(loadgen.run(stack.url, reqs, served_header="x-backend"))
    assert [r.status for r in results] == [200] * 6
    stack.envoy.stop()  # flushes the access log
    picks = picklog.from_access_log(log)
    hostports = {f"{b.host}:{b.port}" for b in stack.backends}
    assert [p.replay for p in picks] == list(range(6))
    for p in picks:
        assert p.pod in hostports and set(p.scores) == hostports and p.request_id
        assert p.scores[p.pod] == max(p.scores.values())
        assert all(0.0 <= v <= 3.0 for v in p.scores.values())
    # the pod Envoy sent each request to is the one the client saw answer
    by_name = {f"{b.host}:{b.port}": b.name for b in stack.backends}
    assert [by_name[p.pod] for p in picks] == [r.served_by for r in results]
    terms = picklog.terms_from_log(stack.epp.log_path)
    assert picklog.attach_terms(picks, terms) == 6
    for p in picks:
        assert set(p.terms) == {"queue-scorer*1", "kv-cache-utilization-scorer*2"}
        total = {pod: p.terms["queue-scorer*1"][pod] + 2 * p.terms["kv-cache-utilization-scorer*2"][pod]
                 for pod in hostports}  # fmt: skip
        assert total == pytest.approx(p.scores, abs=1e-3)
    out = tmp_path / "a.jsonl"
    picklog.write(out, picks)
    again = picklog.read(out)
    assert again == picks
    same = picklog.compare(picks, again)
    assert (same.matched, same.agreement, same.prefix) == (6, 1.0, 6)
