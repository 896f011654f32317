"""Two EPP processes behind one Envoy share each pick's speculative prefix entry through a real redis-server, so a
burst of one prompt prefix sticks to one pod whichever replica routes each request.

The first request of a long prefix is picked by one replica and prefills slowly on a simulator: until the engine's
KV event arrives (after the prefill), only the picking replica's speculative entry says the prefix is there. The rest
of the burst, spread by Envoy over both replicas, goes to the same pod when the entry is shared. With the precise
producer's `syncCrossReplicaState: false` (in-flight load still shared), the other replica sees no cached prefix and
the first request's load on that pod, and sends its share of the burst to the other pod: the test tells the two
apart.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.harness.http import post_json
from e2e.harness.redis import redis_server
from e2e.harness.replicas import start_replicas
from e2e.sim.launch import SimProcess, start_simulators
from e2e.strategies import endpoints_yaml
from epp.tokenization.qwen import QWEN25_MODEL

pytestmark = pytest.mark.e2e

PREFIX = "You review quarterly reports. " + " ".join(f"Item {i}: revenue grew in region {i % 7}." for i in range(60))


def config(sims: list[SimProcess], redis_url: str, share: bool) -> str:
    return (
        "plugins:\n"
        "- type: precise-prefix-cache-producer\n"
        "  parameters:\n"
        "    tokenProcessorConfig: {blockSize: 16}\n"
        "    kvEventsConfig: {topicFilter: 'kv@'}\n"
        "    speculativeTTL: 30s\n"
        f"    syncCrossReplicaState: {str(share).lower()}\n"
        "- {type: inflight-load-producer, parameters: {prefixMatchInfoProducerName: precise-prefix-cache-producer}}\n"
        "- type: prefix-cache-affinity-filter\n"
        "  parameters: {prefixMatchInfoProducerName: precise-prefix-cache-producer, maxTTFTPenaltyMs: 0}\n"
        "- {type: token-load-scorer}\n"
        f"- {{type: redis-cross-replica-syncer, name: xr, parameters: {{address: '{redis_url}', ttl: 2s}}}}\n"
        "schedulingProfiles:\n"
        "- {name: default, plugins: [{pluginRef: prefix-cache-affinity-filter}, {pluginRef: token-load-scorer}]}\n"
        "dataLayer: {crossReplicaSyncerPluginRef: xr, crossReplicaSyncInterval: 50ms}\n" + endpoints_yaml(sims)
    )


@pytest.fixture(scope="module")
def sims() -> Iterator[list[SimProcess]]:
    # ~3 s to prefill the prefix: the burst is routed long before the engine announces the blocks
    args = ["--model", QWEN25_MODEL, "--block-size", "16", "--prefill-time-per-token", "0.004"]
    with start_simulators(2, base_args=args) as sims:
        yield sims


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    with redis_server() as url:
        yield url


def port_of(url: str, prompt: str) -> int:
    r = post_json(url + "/v1/completions", {"model": QWEN25_MODEL, "prompt": prompt, "max_tokens": 1}, timeout=60)
    assert r.status == 200, r.body
    return int(r.headers["x-inference-port"])


@pytest.mark.parametrize("share", [True, False], ids=["shared", "own"])
def test_a_burst_sticks_to_one_pod_whichever_replica_routes_it(
    tmp_path: Path, sims: list[SimProcess], redis_url: str, share: bool
) -> None:
    stack = start_replicas(tmp_path, config(sims, redis_url, share), 2)
    try:
        for s in sims:  # nothing cached from an earlier case
            post_json(s.url + "/reset_prefix_cache", {}, timeout=10)
        before = stack.picks()
        prefix = f"({'shared' if share else 'own'}) {PREFIX}"
        first: list[int] = []
        t = threading.Thread(target=lambda: first.append(port_of(stack.url, prefix + " Question 0?")), daemon=True)
        t.start()
        deadline = time.monotonic() + 10
        while sum(stack.picks()) <= sum(before):
            assert time.monotonic() < deadline, "the first request was not routed"
            time.sleep(0.02)
        time.sleep(0.3)  # a few load-sync intervals: the other replica knows that pod is busy
        ports: list[int] = []
        burst = [
            threading.Thread(target=lambda i=i: ports.append(port_of(stack.url, f"{prefix} Question {i}?")))
            for i in range(1, 9)
        ]
        for b in burst:
            b.start()
            time.sleep(0.05)
        for b in [*burst, t]:
            b.join(60)
        per_replica = [a - b for a, b in zip(stack.picks(), before, strict=True)]
        assert all(n >= 3 for n in per_replica), per_replica  # Envoy spread the burst over both replicas
        assert len(first) == 1 and len(ports) == 8
        if share:
            assert set(ports) == set(first), (first, ports)
        else:
            assert set(ports) - set(first), (first, ports)  # the other replica did not know
    finally:
        stack.close()
