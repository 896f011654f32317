"""Multi-cluster hub routing as llm-d's multi-cluster-routing guide runs it, on loopback: two "clusters", each a real
Envoy + EPP over simulated vLLM pods (cluster A: 1 pod, cluster B: 2), and a hub (Envoy + EPP) whose config is the
guide's `hub-load` policy file as shipped (only the cluster list's path is changed), started with
--allow-experimental-plugins as its hub.values.yaml does. The hub reads each cluster EPP's /metrics
(`metricsAddress`/`metricsPort` in clusters.yaml, auth off as the guide's leaf.values.yaml sets) and forwards each
request to the picked cluster's gateway, whose EPP picks the pod.

1. Idle clusters report the same load and tie: both serve some of the hub's requests (the guide's verify.py check).
2. Cluster A's one pod gets busy (requests sent to A's gateway directly): once A's EPP exports its queue and KV use
   (llm_d_epp_average_queue_size, llm_d_epp_average_kv_cache_utilization) the hub sends every request to cluster B.
   (With both hub scorers made constant, this step fails: the hub's requests queue behind A's.)
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from e2e.harness.http import metric_value, post_json
from e2e.harness.stack import Stack, start_stack
from e2e.sim.launch import SimProcess, start_simulators
from epp.tokenization.qwen import QWEN25_MODEL

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]
HUB_LOAD = ROOT / "tests" / "corpus" / "anchors" / "llm-d__guides__multi-cluster-routing__router__hub-load.values.yaml"
CLUSTER_CONFIG = """plugins:
- {type: queue-scorer}
- {type: kv-cache-utilization-scorer}
- {type: max-score-picker}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: queue-scorer}, {pluginRef: kv-cache-utilization-scorer}, {pluginRef: max-score-picker}]
endpoints:
"""
# A cluster EPP's pool gauges refresh every 5 s by default; the test does not wait that long.
CLUSTER_ARGS = ["--refresh-prometheus-metrics-interval=200ms", "--metrics-endpoint-auth=false"]


def cluster_config(sims: list[SimProcess]) -> str:
    return CLUSTER_CONFIG + "".join(
        f"- {{name: pod{s.http_port}, address: {s.host}, port: {s.http_port}}}\n" for s in sims
    )


def clusters_yaml(clusters: dict[str, Stack]) -> str:
    """The guide's clusters.yaml: where the hub forwards (the cluster's gateway) and where it reads its load."""
    out = ["endpoints:"]
    for name, stack in clusters.items():
        port = stack.url.rsplit(":", 1)[1]
        out += [
            f"  - name: cluster-{name}",
            '    address: "127.0.0.1"',
            f'    port: "{port}"',
            "    labels:",
            '      metricsAddress: "127.0.0.1"',
            f'      metricsPort: "{stack.epp.ports.metrics}"',
        ]
    return "\n".join(out) + "\n"


@pytest.fixture
def clusters(tmp_path: Path) -> Iterator[tuple[Stack, dict[str, Stack], dict[int, str]]]:
    args = ["--max-num-seqs", "1", "--inter-token-latency", "0.02", "--model", QWEN25_MODEL]
    with start_simulators(3, base_args=args, events=False, replay=False) as sims:
        members = {"a": sims[:1], "b": sims[1:]}
        owner = {s.http_port: name for name, group in members.items() for s in group}
        stacks: dict[str, Stack] = {}
        try:
            with ThreadPoolExecutor(2) as pool:
                futures = {}
                for name, group in members.items():
                    (tmp_path / name).mkdir()
                    futures[name] = pool.submit(
                        start_stack, tmp_path / name, backends=[], config=cluster_config(group), epp_args=CLUSTER_ARGS
                    )
                for name, f in futures.items():
                    stacks[name] = f.result()
            (tmp_path / "hub").mkdir()
            listing = tmp_path / "hub" / "clusters.yaml"
            listing.write_text(clusters_yaml(stacks))
            hub_config = HUB_LOAD.read_text().replace("/etc/epp/clusters/clusters.yaml", str(listing))
            hub = start_stack(
                tmp_path / "hub", backends=[], config=hub_config, epp_args=["--allow-experimental-plugins"]
            )
            try:
                yield hub, stacks, owner
            finally:
                hub.close()
        finally:
            for s in stacks.values():
                s.close()


def served_by(url: str, owner: dict[int, str], i: int) -> str:
    r = post_json(url + "/v1/completions", {"model": QWEN25_MODEL, "prompt": f"hello {i}", "max_tokens": 2})
    assert r.status == 200, r.body
    return owner[int(r.headers["x-inference-port"])]


def queue(stack: Stack) -> float:
    return metric_value(stack.epp.metrics_text(), "llm_d_epp_average_queue_size", default=0.0)


def _quietly(url: str, i: int) -> None:
    with contextlib.suppress(OSError):  # the simulators are stopped before the queue drains
        post_json(
            url + "/v1/completions", {"model": QWEN25_MODEL, "prompt": f"load {i}", "max_tokens": 400}, timeout=120
        )


def test_the_hub_routes_between_clusters_by_their_exported_load(
    clusters: tuple[Stack, dict[str, Stack], dict[int, str]],
) -> None:
    hub, stacks, owner = clusters
    # the hub has read both clusters' load (every cluster EPP answers its /metrics)
    deadline = time.monotonic() + 30
    while "llm_d_epp_average_queue_size" not in stacks["a"].epp.metrics_text():
        assert time.monotonic() < deadline
        time.sleep(0.1)
    time.sleep(1.5)  # the hub's scrape interval is 1 s

    # 1. idle clusters tie: both serve
    idle = [served_by(hub.url, owner, i) for i in range(20)]
    assert set(idle) == {"a", "b"}, idle

    # 2. cluster A's pod gets a queue: its EPP exports it, and the hub sends everything to B
    flood = [threading.Thread(target=_quietly, args=(stacks["a"].url, j), daemon=True) for j in range(6)]
    for t in flood:
        t.start()
    deadline = time.monotonic() + 30
    while queue(stacks["a"]) < 3:
        assert time.monotonic() < deadline, stacks["a"].epp.metrics_text()[-2000:]
        time.sleep(0.1)
    assert queue(stacks["b"]) == 0
    time.sleep(1.5)  # one more hub scrape
    loaded = [served_by(hub.url, owner, 100 + i) for i in range(10)]
    assert loaded == ["b"] * 10, loaded
    assert queue(stacks["a"]) >= 2  # still loaded while we asked
