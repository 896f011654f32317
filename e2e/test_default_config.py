"""Envoy + `epp serve` with no plugin section (pyepp's default, config/pyepp-default.yaml) + 4 simulated vLLM pods.

With the pods' KV events off the default still keeps a shared long prefix on the pod that computed it (the
precise producer's approximate fallback: the EPP's routing history, as GIE's default would), and the engine
really reuses it. With events on it is precise: a prefix cached on a pod behind the gateway's back (a request sent
to the pod directly, which only its events can tell) attracts the gateway's requests.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.harness.http import metric_value
from e2e.harness.ports import free_ports
from e2e.harness.simconfig import sim_endpoints_yaml
from e2e.harness.stack import Stack, start_stack
from e2e.sim.launch import SimProcess, start_simulators
from e2e.test_kv_routing import complete
from epp.kvcache.subscriptions import EVENTS_PORT_LABEL
from epp.tokenization.qwen import QWEN25_MODEL

pytestmark = pytest.mark.e2e

PREFIX = "You are reviewing a long lease. " + " ".join(
    f"Article {i}: the tenant shall keep the premises in good repair and pay the rent monthly." for i in range(70)
)


@pytest.fixture(params=["events-off", "events-on"])
def default_stack(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Stack, list[SimProcess], bool]]:
    events = request.param == "events-on"
    with start_simulators(4, base_args=["--block-size", "16", "--model", QWEN25_MODEL], events=events) as sims:
        # events off: each pod's event port is one nothing listens on (no publisher), not a guess at 5557
        labels = None if events else {EVENTS_PORT_LABEL: str(free_ports(1)[0])}
        stack = start_stack(tmp_path, backends=[], config=sim_endpoints_yaml(sims, labels=labels), ready_timeout=120)
        try:
            yield stack, sims, events
        finally:
            stack.close()


def stored_blocks(stack: Stack) -> float:
    return metric_value(stack.epp.metrics_text(), "kv_cache_events_blocks_total", {"op": "stored"})


def test_default_routes_on_prefixes_with_and_without_kv_events(
    default_stack: tuple[Stack, list[SimProcess], bool],
) -> None:
    stack, sims, events = default_stack
    first, _ = complete(stack.url, PREFIX + " Question 0: who repairs the roof?")
    time.sleep(2.5)  # past the speculative entries' TTL (2 s): only the events or the routing history remain
    for i in range(1, 5):
        port, cached = complete(stack.url, PREFIX + f" Question {i}: and the windows?")
        assert port == first, f"turn {i} left the pod holding the prefix"
        assert cached > 1000  # the engine really reused it
    if not events:
        assert stored_blocks(stack) == 0  # nothing came from KV events: the routing history did it
        return
    assert stored_blocks(stack) > 0
    # Precise: another pod gets a different long prompt directly (the EPP never routed it); its events alone say so.
    other = next(s for s in sims if s.http_port != first)
    lease = PREFIX.replace("lease", "charter").replace("tenant", "charterer")
    before = stored_blocks(stack)
    complete(other.url, lease)
    deadline = time.monotonic() + 10
    while stored_blocks(stack) <= before:
        assert time.monotonic() < deadline, "the direct request's KV events never arrived"
        time.sleep(0.05)
    port, cached = complete(stack.url, lease + " Question: who insures the vessel?")
    assert port == other.http_port and cached > 1000
