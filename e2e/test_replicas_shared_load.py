"""Two EPP processes behind one Envoy share their in-flight load through a real redis-server
(redis-cross-replica-syncer, llm-d's dataLayer.crossReplicaSyncerPluginRef).

A long request holds one simulator; every short request after it, whichever replica Envoy hands it to, avoids that
pod (active-request-scorer counts the other replica's request too). With the sharing switched off
(`syncCrossReplicaState: false`) the replica that did not route the long request sees two idle pods and sends some
short requests to the busy one: the test can tell the difference. Within one sync interval only the booking each
replica sends at pick time tells the other: two cold requests, one through each replica, go to different pods.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.harness.http import metric_value, post_json
from e2e.harness.redis import redis_server
from e2e.harness.replicas import ReplicatedStack, start_replicas
from e2e.sim.launch import SimProcess, start_simulators
from epp.tokenization.qwen import QWEN25_MODEL

pytestmark = pytest.mark.e2e


def config(
    sims: list[SimProcess],
    redis_url: str,
    sync: bool,
    *,
    scorer: str = "active-request-scorer",
    ttl: str = "1s",
    interval: str = "50ms",
) -> str:
    eps = "".join(f"- {{name: sim{i}, address: {s.host}, port: {s.http_port}}}\n" for i, s in enumerate(sims))
    return (
        "plugins:\n"
        f"- {{type: inflight-load-producer, parameters: {{syncCrossReplicaState: {str(sync).lower()}}}}}\n"
        f"- {{type: {scorer}}}\n"
        f"- {{type: redis-cross-replica-syncer, name: xr, parameters: {{address: '{redis_url}', ttl: {ttl}}}}}\n"
        f"schedulingProfiles: [{{name: default, plugins: [{{pluginRef: {scorer}}}]}}]\n"
        f"dataLayer: {{crossReplicaSyncerPluginRef: xr, crossReplicaSyncInterval: {interval}}}\n"
        "endpoints:\n" + eps
    )


@pytest.fixture(scope="module")
def sims() -> Iterator[list[SimProcess]]:
    args = ["--inter-token-latency", "0.01", "--model", QWEN25_MODEL]
    with start_simulators(2, base_args=args, events=False, replay=False) as sims:
        yield sims


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    with redis_server() as url:
        yield url


def port_of(url: str, prompt: str, max_tokens: int) -> int:
    r = post_json(
        url + "/v1/completions", {"model": QWEN25_MODEL, "prompt": prompt, "max_tokens": max_tokens}, timeout=60
    )
    assert r.status == 200, r.body
    return int(r.headers["x-inference-port"])


def inflight(stack: ReplicatedStack) -> float:
    return sum(metric_value(e.metrics_text(), "llm_d_epp_inflight_requests", default=0.0) for e in stack.epps)


@pytest.mark.parametrize("sync", [True, False], ids=["shared", "local"])
def test_replicas_share_in_flight_load(tmp_path: Path, sims: list[SimProcess], redis_url: str, sync: bool) -> None:
    stack = start_replicas(tmp_path, config(sims, redis_url, sync), 2)
    try:
        long_port: list[int] = []
        t = threading.Thread(target=lambda: long_port.append(port_of(stack.url, "a long story", 500)), daemon=True)
        t.start()
        deadline = time.monotonic() + 10
        while inflight(stack) < 1:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        time.sleep(0.3)  # a few sync intervals
        shorts = []
        for i in range(6):
            shorts.append(port_of(stack.url, f"short question {i}", 1))
            time.sleep(0.2)  # the other replica's view of this short request is up to one sync interval stale
        t.join(30)
        busy = long_port[0]
        per_replica = stack.picks()
        assert all(n >= 3 for n in per_replica), per_replica  # Envoy spread the requests over both replicas
        if sync:
            assert busy not in shorts, (busy, shorts)
        else:
            assert busy in shorts, (busy, shorts)  # the other replica did not know
    finally:
        stack.close()


def cold_config(sims: list[SimProcess], redis_url: str, sync: bool) -> str:
    """Token load only, and a sync round every 5 s: only the booking sent at pick time can tell the other replica."""
    return config(sims, redis_url, sync, scorer="token-load-scorer", ttl="30s", interval="5s")


@pytest.mark.parametrize("sync", [True, False], ids=["shared", "local"])
def test_two_cold_requests_within_one_sync_interval_go_to_different_pods(
    tmp_path: Path, slow_sims: list[SimProcess], redis_url: str, sync: bool
) -> None:
    """Two fresh replicas break a tie the same way (the picker's rotation), so the second replica, asked within the
    5 s sync interval, sends its cold request to the pod the first one just loaded unless the booking reached it."""
    stack = start_replicas(tmp_path, cold_config(slow_sims, redis_url, sync), 2)
    try:
        time.sleep(0.5)  # both replicas' first sync round is done; the next is 5 s away
        long_prompt = "Summarize: " + " ".join(f"line {i} of the log says the job ran." for i in range(120))
        first: list[int] = []
        t = threading.Thread(target=lambda: first.append(port_of(stack.url, long_prompt, 1)), daemon=True)
        t.start()
        deadline = time.monotonic() + 10
        while sum(stack.picks()) < 1:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        time.sleep(0.2)  # the booking's pub/sub message, not a sync round (5 s)
        second = port_of(stack.url, "Another cold prompt: " + long_prompt, 1)
        t.join(60)
        per_replica = stack.picks()
        assert per_replica == [1.0, 1.0], per_replica  # one request through each replica
        if sync:
            assert second != first[0], (first, second)
        else:
            assert second == first[0], (first, second)  # the other replica did not know
    finally:
        stack.close()


@pytest.fixture(scope="module")
def slow_sims() -> Iterator[list[SimProcess]]:
    args = ["--model", QWEN25_MODEL, "--prefill-time-per-token", "0.004"]  # ~4 s in prefill: still in flight
    with start_simulators(2, base_args=args, events=False, replay=False) as sims:
        yield sims
