"""Two EPP replicas behind one Envoy (both in its ext_proc cluster) sharing state through a real redis-server, and
what happens when a part goes away mid-run.

- Redis stops: every request still gets a pick (each replica routes on its own state), each replica says so in
  `epp_cross_replica_connected` (0) and a log line; Redis comes back on the same port and the replicas share again
  (the gauge is 1 and a pick on one replica is again booked on the other).
- A replica is killed (SIGKILL) under a steady stream of requests: Envoy's other EPP host takes over; no request
  fails beyond the ones in flight through the killed replica at that moment.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import http.client
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from e2e.harness.http import metric_value, post_json
from e2e.harness.ports import free_ports
from e2e.harness.redis import redis_server
from e2e.harness.replicas import ReplicatedStack, start_replicas
from e2e.sim.launch import SimProcess, start_simulators
from epp.tokenization.qwen import QWEN25_MODEL

pytestmark = pytest.mark.e2e


def config(sims: list[SimProcess], redis_url: str) -> str:
    eps = "".join(f"- {{name: sim{i}, address: {s.host}, port: {s.http_port}}}\n" for i, s in enumerate(sims))
    return (
        "plugins:\n"
        "- {type: inflight-load-producer}\n"
        "- {type: active-request-scorer}\n"
        f"- {{type: redis-cross-replica-syncer, name: xr, parameters: {{address: '{redis_url}', ttl: 1s}}}}\n"
        "schedulingProfiles: [{name: default, plugins: [{pluginRef: active-request-scorer}]}]\n"
        "dataLayer: {crossReplicaSyncerPluginRef: xr, crossReplicaSyncInterval: 50ms}\n"
        "endpoints:\n" + eps
    )


@pytest.fixture(scope="module")
def sims() -> Iterator[list[SimProcess]]:
    args = ["--inter-token-latency", "0.01", "--model", QWEN25_MODEL]
    with start_simulators(2, base_args=args, events=False, replay=False) as sims:
        yield sims


def ask(url: str, i: int, max_tokens: int = 1) -> int:
    """The status, or -1 when there is none to read: the connection failed (OSError) or the response was cut
    before its end (http.client.HTTPException, e.g. IncompleteRead when the replica streaming it was killed)."""
    body = {"model": QWEN25_MODEL, "prompt": f"question {i}", "max_tokens": max_tokens}
    try:
        return post_json(url + "/v1/completions", body, timeout=30).status
    except (OSError, http.client.HTTPException):
        return -1


def connected(stack: ReplicatedStack) -> list[float]:
    return [metric_value(e.metrics_text(), "epp_cross_replica_connected", default=-1.0) for e in stack.epps]


def delivered(stack: ReplicatedStack) -> list[float]:
    labels = {"direction": "in", "result": "delivered"}
    return [metric_value(e.metrics_text(), "epp_cross_replica_messages_total", labels, 0.0) for e in stack.epps]


def until(what: str, check: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_replicas_route_through_a_redis_outage_and_share_again_after(tmp_path: Path, sims: list[SimProcess]) -> None:
    (port,) = free_ports(1)
    with contextlib.ExitStack() as redis:
        url = redis.enter_context(redis_server(port))
        stack = start_replicas(tmp_path, config(sims, url), 2)
        try:
            until("both replicas connected", lambda: connected(stack) == [1.0, 1.0])
            assert all(ask(stack.url, i) == 200 for i in range(4))
            until("bookings delivered", lambda: all(n > 0 for n in delivered(stack)))
            redis.close()  # Redis goes away
            statuses = [ask(stack.url, i) for i in range(10)]
            assert statuses == [200] * 10, statuses  # routing goes on, on each replica's own state
            until("the outage said in the gauge", lambda: connected(stack) == [0.0, 0.0])
            for e in stack.epps:
                assert "routing on this replica's own state" in e.log_text()
            with redis_server(port):  # back, on the same address
                until("both replicas connected again", lambda: connected(stack) == [1.0, 1.0])
                before = delivered(stack)
                time.sleep(1.0)  # the subscriptions are back (their retry backs off up to the sync interval)
                assert all(ask(stack.url, 100 + i) == 200 for i in range(6))
                until("bookings shared again", lambda: all(map(float.__gt__, delivered(stack), before)))
                assert "reachable again" in stack.epps[0].log_text()
        finally:
            stack.close()


def test_a_replica_killed_mid_run_loses_only_its_in_flight_requests(tmp_path: Path, sims: list[SimProcess]) -> None:
    with redis_server() as url:
        stack = start_replicas(tmp_path, config(sims, url), 2)
        try:
            statuses: list[tuple[float, int]] = []
            lock = threading.Lock()
            stop = time.monotonic() + 8.0
            killed_at: list[float] = []

            def client(c: int) -> None:
                i = 0
                while time.monotonic() < stop:
                    started = time.monotonic()
                    s = ask(stack.url, 1000 * c + i, max_tokens=10)  # ~100 ms at the simulators
                    with lock:
                        statuses.append((started, s))
                    i += 1

            with concurrent.futures.ThreadPoolExecutor(4) as pool:
                futures = [pool.submit(client, c) for c in range(4)]
                time.sleep(3.0)
                killed_at.append(time.monotonic())
                stack.epps[1].proc.kill()
                for f in futures:
                    f.result()
            after = [s for t, s in statuses if t > killed_at[0]]
            failed = [s for _, s in statuses if s != 200]
            print(f"{len(statuses)} requests, {len(after)} after the kill, failed: {failed}")
            assert len(after) > 20
            assert len(failed) <= 4, failed  # at most the 4 in flight when the replica died
        finally:
            stack.close()
