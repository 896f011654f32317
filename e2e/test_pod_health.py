"""A dead pod and a hung pod stop receiving traffic fast, and a recovered pod gets it again (issue 15 item 3).

Envoy + EPP (precise prefix-cache routing, so a prompt keeps going to the pod that holds its prefix) + 3 simulator
processes. The pod holding the prefix is SIGKILLed, then another one SIGSTOPped; requests with that prefix are
sent one after another and we measure how long after the fault requests kept failing. Before the fix a killed
pod's prefix got 503s for the whole 30 s the pod was down, and a hung pod kept receiving requests.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.harness.http import metric_value, post_json
from e2e.harness.stack import Stack, start_stack
from e2e.sim.launch import SimProcess, start_simulators
from e2e.test_kv_routing import PREFIX, config
from epp.tokenization.qwen import QWEN25_MODEL

pytestmark = pytest.mark.e2e


@pytest.fixture
def health_stack(tmp_path: Path) -> Iterator[tuple[Stack, list[SimProcess]]]:
    with start_simulators(3, base_args=["--block-size", "16", "--model", QWEN25_MODEL]) as sims:
        stack = start_stack(tmp_path, backends=[], config=config(sims))
        try:
            yield stack, sims
        finally:
            for s in sims:  # a stopped process cannot be terminated
                if s.alive():
                    os.kill(s.proc.pid, signal.SIGCONT)
            stack.close()


def attempt(url: str, i: int, timeout: float) -> int | None:
    """The port of the simulator that served the request, None if it failed or timed out."""
    try:
        r = post_json(
            url + "/v1/completions",
            {"model": QWEN25_MODEL, "prompt": PREFIX + f" Question {i}?", "max_tokens": 2},
            timeout=timeout,
        )
    except OSError:
        return None
    return int(r.headers["x-inference-port"]) if r.status == 200 else None


def time_to_recover(url: str, fault_at: float, timeout: float, window: float = 4.0) -> tuple[float, int, set[int]]:
    """Requests one after another for `window` s after the fault: (send time, relative to the fault, of the first
    request from which on all succeeded; failures; ports that served after that)."""
    results: list[tuple[float, int | None]] = []
    i = 0
    while time.monotonic() - fault_at < window:
        t = time.monotonic() - fault_at
        results.append((t, attempt(url, i, timeout)))
        i += 1
    failures = [t for t, port in results if port is None]
    last_failure = max(failures) if failures else -1.0
    after = [(t, port) for t, port in results if t > last_failure]
    assert after, "requests never recovered"
    return after[0][0], len(failures), {port for _, port in after if port is not None}


def test_dead_and_hung_pods_stop_receiving_traffic(health_stack: tuple[Stack, list[SimProcess]]) -> None:
    stack, sims = health_stack
    by_port = {s.http_port: s for s in sims}
    owner = by_port[attempt(stack.url, 0, 60) or 0]  # the first request loads the tokenizer
    for i in range(1, 4):
        assert attempt(stack.url, i, 10) == owner.http_port  # the prefix lives there

    owner.kill()
    killed_at = time.monotonic()
    dead_recovery, dead_failures, served = time_to_recover(stack.url, killed_at, timeout=2.0)
    assert owner.http_port not in served
    print(f"\nkilled pod: requests failed for {dead_recovery:.3f} s ({dead_failures} failures)")
    assert dead_recovery < 1.0

    survivors = [s for s in sims if s is not owner]
    hung = by_port[attempt(stack.url, 100, 10) or 0]  # where the prefix is routed now
    os.kill(hung.proc.pid, signal.SIGSTOP)
    hung_at = time.monotonic()
    hung_recovery, hung_failures, served = time_to_recover(stack.url, hung_at, timeout=1.0)
    assert hung.http_port not in served and served <= {s.http_port for s in survivors}
    print(f"SIGSTOPped pod: requests failed for {hung_recovery:.3f} s ({hung_failures} failures)")
    assert hung_recovery < 2.5

    os.kill(hung.proc.pid, signal.SIGCONT)  # back: it holds the prefix, so it gets the prefix's requests again
    deadline = time.monotonic() + 10
    while attempt(stack.url, 200, 10) != hung.http_port:
        assert time.monotonic() < deadline, "the recovered pod never got traffic again"
        time.sleep(0.1)
    text = stack.epp.metrics_text()
    assert metric_value(text, "pyepp_endpoint_unhealthy_total", {"reason": "scrape_failures"}) >= 2
