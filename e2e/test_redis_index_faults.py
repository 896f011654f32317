"""Envoy + EPP (precise prefix scoring on the Redis index backend) + 2 simulators publishing KV events, with a real
redis-server killed, restarted empty on the same port, and hung (SIGSTOP).

Before the fix, with Redis killed only 1 of 8 warmed prompts returned to its pod (prefix routing silently off,
the local copy unused and failed flushes dropped), and after an empty restart nothing was rebuilt. Here every
repeat of a warmed prompt must return to its pod in every phase, a prompt warmed during the outage too, the
shared map must be rebuilt within 3 s of the restart, and a hung Redis must not hold requests for the producers'
400 ms budget.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from e2e.harness.http import metric_value, post_json
from e2e.harness.ports import free_port
from e2e.harness.redis import redis_process
from e2e.harness.simconfig import sim_endpoints_yaml
from e2e.harness.stack import Stack, start_stack
from e2e.sim.launch import SimProcess, start_simulators
from epp.tokenization.qwen import QWEN25_MODEL

pytestmark = pytest.mark.e2e

REBUILD_WITHIN = 3.0  # seconds from Redis answering again to the shared map holding the replica's entries


def prompt(i: int) -> str:
    return f"Case {i}: you review a contract. " + " ".join(
        f"Clause {j} of case {i}: the supplier delivers the goods in good order." for j in range(40)
    )


def config(sims: list[SimProcess], url: str) -> str:
    lines = [
        "plugins:",
        "  - type: precise-prefix-cache-scorer",
        "    parameters:",
        "      tokenProcessorConfig: {blockSize: 16, hashSeed: '7'}",
        "      kvEventsConfig: {topicFilter: 'kv@', concurrency: 2}",
        "      speculativeIndexing: false",
        f"      indexerConfig: {{kvBlockIndexConfig: {{redisConfig: {{address: '{url}'}}}}}}",
        "  - type: max-score-picker",
        "schedulingProfiles:",
        "  - name: default",
        "    plugins: [{pluginRef: precise-prefix-cache-scorer, weight: 1}, {pluginRef: max-score-picker}]",
    ]
    return "\n".join(lines) + "\n" + sim_endpoints_yaml(sims)


def served_by(stack: Stack, text: str) -> int:
    r = post_json(stack.url + "/v1/completions", {"model": QWEN25_MODEL, "prompt": text, "max_tokens": 2})
    assert r.status == 200, r.body
    return int(r.headers["x-inference-port"])


def metric(stack: Stack, name: str, labels: dict[str, str] | None = None) -> float:
    return metric_value(stack.epp.metrics_text(), name, labels, default=0.0)


def wait_for(cond: object, timeout: float, what: str) -> float:
    t0 = time.monotonic()
    while not cond():  # type: ignore[operator]
        assert time.monotonic() - t0 < timeout, what
        time.sleep(0.05)
    return time.monotonic() - t0


def warm(stack: Stack, ids: range) -> dict[int, int]:
    stored = metric(stack, "kv_cache_events_blocks_total", {"op": "stored"})
    owners = {i: served_by(stack, prompt(i) + " Q0") for i in ids}
    wait_for(
        lambda: metric(stack, "kv_cache_events_blocks_total", {"op": "stored"}) >= stored + 20 * len(ids),
        10,
        "KV events of the warm-up",
    )
    time.sleep(0.2)
    return owners


def hits(stack: Stack, owners: dict[int, int], tag: str) -> int:
    return sum(served_by(stack, prompt(i) + f" {tag}") == port for i, port in owners.items())


@pytest.fixture
def sims() -> Iterator[list[SimProcess]]:
    with start_simulators(2, base_args=["--block-size", "16", "--model", QWEN25_MODEL]) as sims:
        yield sims


def test_redis_killed_restarted_empty_and_hung(sims: list[SimProcess], tmp_path: Path) -> None:
    port = free_port()
    with contextlib.ExitStack() as cleanup:
        url, proc = cleanup.enter_context(redis_process(port))
        stack = start_stack(tmp_path, backends=[], config=config(sims, url))
        cleanup.callback(stack.close)
        owners = warm(stack, range(6))
        assert hits(stack, owners, "pre") == 6  # the pre-fault rate
        keys_before = redis.Redis.from_url(url).dbsize()
        assert keys_before > 0

        proc.kill()
        proc.wait()
        assert hits(stack, owners, "down") == 6  # answered by the local copy
        assert metric(stack, "kv_cache_index_redis_up") == 0
        owners |= warm(stack, range(6, 8))  # learned while Redis is down
        assert hits(stack, owners, "down2") == 8

        url, proc = cleanup.enter_context(redis_process(port))  # restarted empty, on the same port
        client = redis.Redis.from_url(url)
        took = wait_for(lambda: client.dbsize() >= keys_before, REBUILD_WITHIN + 2, "rebuild after restart")
        assert took < REBUILD_WITHIN, took
        assert metric(stack, "kv_cache_index_redis_up") == 1
        assert metric(stack, "kv_cache_index_redis_resyncs_total", {"kind": "rebuild"}) >= 1
        assert hits(stack, owners, "back") == 8

        proc.send_signal(signal.SIGSTOP)  # hung: every request would wait the 400 ms producer budget
        t0 = time.monotonic()
        n = hits(stack, owners, "hung")
        per_request = (time.monotonic() - t0) / len(owners)
        assert n == 8 and per_request < 0.3, per_request
        proc.send_signal(signal.SIGCONT)
        wait_for(lambda: metric(stack, "kv_cache_index_redis_up") == 1, 5, "up after SIGCONT")
        assert hits(stack, owners, "after") == 8
