"""Kubernetes discovery against the fake API server, driven by the real kubernetes-asyncio client."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from pathlib import Path

import pytest

from epp.datalayer.datastore import Datastore
from epp.discovery.informer import PODS as POD_KIND
from epp.discovery.informer import Informer
from epp.discovery.kubeclient import api_client, load_configuration
from epp.discovery.kubernetes import (
    KubernetesArgsError,
    KubernetesDiscoveryConfig,
    add_kubernetes_args,
    kubernetes_config_from_args,
    label_selector,
)
from epp.discovery.pods import ACTIVE_PORTS_ANNOTATION, pod_endpoints
from epp.framework import Endpoint
from tests.fakekube.server import INFERENCE_POOLS, PODS, FakeKube, inference_pool, pod, ready_patch
from tests.fakekube.testing import eventually, names, running_source, write_kubeconfig

APP = {"app": "vllm"}


@pytest.fixture
def cfg(kube: FakeKube, tmp_path: Path) -> KubernetesDiscoveryConfig:
    return KubernetesDiscoveryConfig(pool_name="pool", kubeconfig=write_kubeconfig(kube, tmp_path), watch_timeout=30)


class Recorder:
    def __init__(self) -> None:
        self.added: list[str] = []
        self.updated: list[str] = []
        self.removed: list[str] = []

    def endpoint_added(self, ep: Endpoint) -> None:
        self.added.append(ep.name)

    def endpoint_updated(self, ep: Endpoint) -> None:
        self.updated.append(ep.name)

    def endpoint_removed(self, ep: Endpoint) -> None:
        self.removed.append(ep.name)


def test_pod_endpoint_rules() -> None:
    p = pod("p", "10.0.0.1", {"app": "vllm", "rev": "1"}, annotations={ACTIVE_PORTS_ANNOTATION: "8001, x,8002"})
    eps = pod_endpoints(p, [8000, 8001, 8002], metrics_port=9000)
    assert [(e.name, e.port, e.metrics_port) for e in eps] == [("p-rank-1", 8001, None), ("p-rank-2", 8002, None)]
    assert (
        eps[0].pod_name == "p" and eps[0].labels == {"app": "vllm", "rev": "1"} and eps[0].hostport == "10.0.0.1:8001"
    )
    single = pod_endpoints(pod("q", "10.0.0.2", {}), [8000], metrics_port=9000)
    assert [(e.name, e.metrics_hostport) for e in single] == [("q-rank-0", "10.0.0.2:9000")]
    assert pod_endpoints(pod("r", "10.0.0.3", {}, ready=False), [8000]) == []
    assert pod_endpoints(pod("s", None, {}), [8000]) == []
    terminating = pod("t", "10.0.0.4", {})
    terminating["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert pod_endpoints(terminating, [8000]) == []
    no_conditions = pod("u", "10.0.0.5", {})
    no_conditions["status"]["conditions"] = []
    assert pod_endpoints(no_conditions, [8000]) == []


async def test_discovers_ready_pods_per_target_port(kube: FakeKube, cfg: KubernetesDiscoveryConfig) -> None:
    kube.create(INFERENCE_POOLS, inference_pool("pool", APP, [8000, 8001]))
    kube.create(PODS, pod("a", "10.0.0.1", {**APP, "zone": "z1"}))
    kube.create(PODS, pod("b", "10.0.0.2", APP, ready=False))
    kube.create(PODS, pod("c", "10.0.0.3", {"app": "other"}))
    kube.create(PODS, pod("d", "10.0.0.4", APP, namespace="elsewhere"))
    async with running_source(cfg) as (_, ds):
        assert not ds.synced
        await eventually(lambda: ds.synced, what="sync")
        assert names(ds) == {"a-rank-0", "a-rank-1"}
        ep = ds.get("a-rank-1")
        assert ep is not None and ep.hostport == "10.0.0.1:8001" and ep.pod_name == "a"
        assert ep.namespace == "default" and ep.labels == {"app": "vllm", "zone": "z1"}
        kube.create(PODS, pod("e", "10.0.0.5", APP))
        await eventually(lambda: names(ds) == {"a-rank-0", "a-rank-1", "e-rank-0", "e-rank-1"}, what="new pod")


async def test_readiness_and_termination(kube: FakeKube, cfg: KubernetesDiscoveryConfig) -> None:
    kube.create(INFERENCE_POOLS, inference_pool("pool", APP, [8000]))
    kube.create(PODS, pod("a", "10.0.0.1", APP, ready=False))
    rec = Recorder()
    ds = Datastore()
    ds.subscribe(rec)
    async with running_source(cfg, datastore=ds):
        await eventually(lambda: ds.synced)
        assert names(ds) == set()
        kube.patch(PODS, "default", "a", ready_patch(True))
        await eventually(lambda: names(ds) == {"a-rank-0"}, what="ready")
        kube.patch(PODS, "default", "a", ready_patch(False))
        await eventually(lambda: names(ds) == set(), what="unready")
        kube.patch(PODS, "default", "a", ready_patch(True))
        await eventually(lambda: names(ds) == {"a-rank-0"})
        kube.delete(PODS, "default", "a", graceful=True)  # terminating: still Ready, but leaving
        await eventually(lambda: names(ds) == set(), what="terminating")
        kube.delete(PODS, "default", "a")
        kube.create(PODS, pod("a", "10.0.0.9", APP))  # same name, new IP
        await eventually(lambda: ds.get("a-rank-0") is not None and ds.get("a-rank-0").address == "10.0.0.9")  # type: ignore[union-attr]
        kube.patch(PODS, "default", "a", {"metadata": {"labels": {"app": "vllm", "x": "y"}}})
        await eventually(lambda: ds.get("a-rank-0") is not None and ds.get("a-rank-0").labels.get("x") == "y")  # type: ignore[union-attr]
    # Listeners (scrapers, KV subscribers) were told about every removal.
    assert rec.added == ["a-rank-0"] * 3 and rec.removed == ["a-rank-0"] * 3


async def test_active_ports_annotation(kube: FakeKube, cfg: KubernetesDiscoveryConfig) -> None:
    kube.create(INFERENCE_POOLS, inference_pool("pool", APP, [8000, 8001, 8002]))
    kube.create(PODS, pod("a", "10.0.0.1", APP, annotations={ACTIVE_PORTS_ANNOTATION: "8000,8002"}))
    async with running_source(cfg) as (_, ds):
        await eventually(lambda: names(ds) == {"a-rank-0", "a-rank-2"}, what="two active ranks")
        kube.patch(PODS, "default", "a", {"metadata": {"annotations": {ACTIVE_PORTS_ANNOTATION: "8001"}}})
        await eventually(lambda: names(ds) == {"a-rank-1"}, what="one active rank")
        kube.patch(PODS, "default", "a", {"metadata": {"annotations": {ACTIVE_PORTS_ANNOTATION: None}}})
        await eventually(lambda: names(ds) == {"a-rank-0", "a-rank-1", "a-rank-2"}, what="all ranks")


async def test_selector_and_target_port_changes_resync(kube: FakeKube, cfg: KubernetesDiscoveryConfig) -> None:
    kube.create(INFERENCE_POOLS, inference_pool("pool", APP, [8000]))
    kube.create(PODS, pod("a", "10.0.0.1", APP))
    kube.create(PODS, pod("b", "10.0.0.2", {"app": "new"}))
    async with running_source(cfg) as (source, ds):
        await eventually(lambda: names(ds) == {"a-rank-0"})
        kube.patch(INFERENCE_POOLS, "default", "pool", {"spec": {"targetPorts": [{"number": 8000}, {"number": 8001}]}})
        await eventually(lambda: names(ds) == {"a-rank-0", "a-rank-1"}, what="ports resync")
        assert source.pod_informer_starts == 1  # same selector: recomputed from the cache, no new watch
        kube.patch(INFERENCE_POOLS, "default", "pool", {"spec": {"selector": {"matchLabels": {"app": "new"}}}})
        await eventually(lambda: names(ds) == {"b-rank-0", "b-rank-1"}, what="selector resync")
        assert source.pod_informer_starts == 2
        # Only the new selector's pod watch stays open (the old informer may have been stopped before it watched).
        await eventually(
            lambda: (
                [q.get("labelSelector") for q in kube.open_watch_queries("pods")] == ["app=new"]
                and kube.open_watches == 2
            ),
            what="old watch closed",
        )
        assert kube.watch_requests("pods")[-1].query["labelSelector"] == "app=new"
        kube.create(PODS, pod("c", "10.0.0.3", APP))  # old selector: ignored now
        kube.create(PODS, pod("d", "10.0.0.4", {"app": "new"}))
        await eventually(lambda: names(ds) == {"b-rank-0", "b-rank-1", "d-rank-0", "d-rank-1"})


async def test_pool_deleted_clears_and_recreated_restores(kube: FakeKube, cfg: KubernetesDiscoveryConfig) -> None:
    kube.create(PODS, pod("a", "10.0.0.1", APP))
    async with running_source(cfg) as (_, ds):
        await eventually(lambda: kube.open_watches == 1, what="pool watch")
        assert not ds.synced and names(ds) == set()  # no pool yet: not ready to serve
        kube.create(INFERENCE_POOLS, inference_pool("pool", APP, [8000]))
        await eventually(lambda: ds.synced and names(ds) == {"a-rank-0"})
        kube.create(INFERENCE_POOLS, inference_pool("other-pool", {"app": "x"}, [1]))  # filtered by name
        kube.delete(INFERENCE_POOLS, "default", "pool")
        await eventually(lambda: not ds.synced and names(ds) == set(), what="cleared")
        kube.create(INFERENCE_POOLS, inference_pool("pool", APP, [8000]))
        await eventually(lambda: ds.synced and names(ds) == {"a-rank-0"}, what="restored")


async def test_standalone_selector_mode(kube: FakeKube, tmp_path: Path) -> None:
    cfg = KubernetesDiscoveryConfig(
        endpoint_selector={"app": "vllm"}, target_ports=[8000, 8001], kubeconfig=write_kubeconfig(kube, tmp_path)
    )
    kube.create(PODS, pod("a", "10.0.0.1", APP))
    async with running_source(cfg) as (_, ds):
        await eventually(lambda: ds.synced and names(ds) == {"a-rank-0", "a-rank-1"})
    assert kube.list_requests("inferencepools") == []


def test_label_selector_syntax() -> None:
    """llm-d-router v0.10 parses --endpoint-selector with labels.Parse: equality, set-based and existence."""
    assert label_selector("app=vllm,tier==gpu") == ({"app": "vllm", "tier": "gpu"}, "app=vllm,tier=gpu")
    assert label_selector("env in (prod, staging),tier!=frontend") == (None, "env in (prod,staging),tier!=frontend")
    assert label_selector("app=vllm,gpu,!deprecated,example.com/zone notin (a)") == (
        None,
        "app=vllm,gpu,!deprecated,example.com/zone notin (a)",
    )
    c = kubernetes_config_from_args(
        _parse(["--endpoint-selector", "app in (vllm,sglang)", "--endpoint-target-ports", "8000"])
    )
    assert c is not None and c.endpoint_selector is None and c.endpoint_selector_expr == "app in (vllm,sglang)"


async def test_standalone_set_based_selector(kube: FakeKube, tmp_path: Path) -> None:
    cfg = KubernetesDiscoveryConfig(
        endpoint_selector_expr="app in (vllm,sglang),!canary",
        target_ports=[8000],
        kubeconfig=write_kubeconfig(kube, tmp_path),
    )
    kube.create(PODS, pod("a", "10.0.0.1", {"app": "vllm"}))
    kube.create(PODS, pod("b", "10.0.0.2", {"app": "sglang"}))
    kube.create(PODS, pod("c", "10.0.0.3", {"app": "vllm", "canary": "1"}))
    kube.create(PODS, pod("d", "10.0.0.4", {"app": "other"}))
    async with running_source(cfg) as (_, ds):
        await eventually(lambda: ds.synced and names(ds) == {"a-rank-0", "b-rank-0"})
    assert {r.query.get("labelSelector") for r in kube.list_requests("pods")} == {"app in (vllm,sglang),!canary"}


async def test_bookmarks_keep_the_resume_point_current(tmp_path: Path) -> None:
    kube = FakeKube(bookmark_interval=0.05)
    await kube.start()
    try:
        cfg = KubernetesDiscoveryConfig(pool_name="pool", kubeconfig=write_kubeconfig(kube, tmp_path))
        kube.create(INFERENCE_POOLS, inference_pool("pool", APP, [8000]))
        kube.create(PODS, pod("a", "10.0.0.1", APP))
        async with running_source(cfg) as (source, ds):
            await eventually(lambda: names(ds) == {"a-rank-0"})
            for i in range(5):
                kube.create(PODS, pod(f"other-{i}", f"10.1.0.{i}", {"app": "other"}))
            head = str(kube.resource_version)
            informer = source.pod_informer
            assert informer is not None
            await eventually(lambda: informer.resource_version == head, what="bookmark RV")
            assert informer.stats.bookmarks > 0
            kube.end_watches()
            await eventually(lambda: len(kube.watch_requests("pods")) >= 2, what="resumed watch")
            assert kube.watch_requests("pods")[1].query["resourceVersion"] == head
            assert informer.stats.lists == 1  # resumed, not re-listed
            kube.create(PODS, pod("b", "10.0.0.2", APP))
            await eventually(lambda: names(ds) == {"a-rank-0", "b-rank-0"})
    finally:
        await kube.stop()


async def test_410_gone_relists_and_converges(kube: FakeKube, cfg: KubernetesDiscoveryConfig) -> None:
    kube.create(INFERENCE_POOLS, inference_pool("pool", APP, [8000]))
    for n in "abc":
        kube.create(PODS, pod(n, f"10.0.0.{ord(n)}", APP))
    # Keep the watch from reconnecting until the history is compacted.
    async with running_source(cfg) as (source, ds):
        await eventually(lambda: names(ds) == {"a-rank-0", "b-rank-0", "c-rank-0"})
        informer = source.pod_informer
        assert informer is not None
        kube.fail_next(2, when=lambda r: r.path.endswith("/pods"))
        kube.cut_watches()
        kube.delete(PODS, "default", "a")  # missed while disconnected
        kube.patch(PODS, "default", "b", ready_patch(False))
        kube.create(PODS, pod("d", "10.0.0.100", APP))
        kube.compact()
        await eventually(lambda: names(ds) == {"c-rank-0", "d-rank-0"}, what="converged after 410")
        assert informer.stats.relists_after_gone >= 1
        assert informer.stats.lists >= 2
        gone = [r for r in kube.watch_requests("pods") if int(r.query["resourceVersion"]) < kube._compacted_rv]
        assert gone  # the watch really did try to resume from an expired RV


async def test_reconnects_with_exponential_backoff(kube: FakeKube, cfg: KubernetesDiscoveryConfig) -> None:
    kube.create(INFERENCE_POOLS, inference_pool("pool", APP, [8000]))
    kube.create(PODS, pod("a", "10.0.0.1", APP))
    async with running_source(cfg) as (source, ds):
        await eventually(lambda: names(ds) == {"a-rank-0"})
        informer = source.pod_informer
        assert informer is not None
        # The delays the informer draws, one before each attempt (wall-clock gaps alone say nothing on a loaded box:
        # a stalled loop stretches any of them).
        delays: list[float] = []
        draw = informer.backoff.next

        def recorded() -> float:
            delays.append(draw())
            return delays[-1]

        informer.backoff.next = recorded  # type: ignore[method-assign]
        before = len(kube.requests)
        kube.fail_next(5, when=lambda r: r.path.endswith("/pods"))
        kube.cut_watches()
        kube.create(PODS, pod("b", "10.0.0.2", APP))
        await eventually(lambda: names(ds) == {"a-rank-0", "b-rank-0"}, what="recovered")
        attempts = [r.at for r in kube.requests[before:] if r.path.endswith("/pods")]
        # Five 503s, then the attempt that worked; one delay after each 503, plus one after the cut when the client
        # saw it as an error rather than the stream's end.
        assert len(attempts) == 6 and len(delays) in (5, 6), (attempts, delays)
        # Backoff(0.05 .. 0.4): the k-th delay is in [d/2, d] with d = 0.05 * 2^k, at most 0.4.
        for k, delay in enumerate(delays):
            d = min(0.4, 0.05 * 2**k)
            assert d / 2 <= delay <= d, (k, delays)
        # ... and each retry really waited for its delay.
        after_503 = delays[-5:]
        for k in range(5):
            assert attempts[k + 1] - attempts[k] >= after_503[k] - 0.005, (k, attempts, delays)
        assert informer.stats.errors >= 5


async def test_watch_sock_read_timeout_is_bounded(kube: FakeKube, cfg: KubernetesDiscoveryConfig) -> None:
    """The server-side timeout is always passed (so 410 handling is ours) and varies per watch (no herd)."""
    kube.create(INFERENCE_POOLS, inference_pool("pool", APP, [8000]))
    async with running_source(cfg) as (_, ds):
        await eventually(lambda: ds.synced and len(kube.watch_requests("pods")) == 1)
        q = kube.watch_requests("pods")[0].query
        assert 30 <= int(q["timeoutSeconds"]) <= 60 and q["allowWatchBookmarks"].lower() == "true"


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_kubernetes_args(p)
    return p.parse_args(argv)


def test_cli_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    assert kubernetes_config_from_args(_parse([])) is None
    monkeypatch.setenv("NAMESPACE", "team-a")
    c = kubernetes_config_from_args(_parse(["--pool-name", "p", "--kubeconfig", "/k"]))
    assert c is not None and (c.pool_name, c.namespace, c.pool_group, c.kubeconfig) == (
        "p",
        "team-a",
        "inference.networking.k8s.io",
        "/k",
    )
    c = kubernetes_config_from_args(
        _parse(["--endpoint-selector", "app=vllm,tier=gpu", "--endpoint-target-ports", "8000,8001"])
    )
    assert c is not None and c.endpoint_selector == {"app": "vllm", "tier": "gpu"} and c.target_ports == [8000, 8001]
    for bad in (
        ["--pool-name", "p", "--endpoint-selector", "a=b", "--endpoint-target-ports", "1"],
        ["--endpoint-selector", "a=b"],
        ["--endpoint-selector", "a=b", "--endpoint-target-ports", "1,1"],
        ["--endpoint-selector", "a=b", "--endpoint-target-ports", "70000"],
        ["--endpoint-selector", "a=b", "--endpoint-target-ports", "x"],
        ["--endpoint-selector", "a in b", "--endpoint-target-ports", "1"],
        ["--endpoint-selector", "=x", "--endpoint-target-ports", "1"],
        ["--endpoint-selector", "a=b,,c=d", "--endpoint-target-ports", "1"],
        ["--endpoint-selector", "a in ()", "--endpoint-target-ports", "1"],
        ["--endpoint-target-ports", "1"],
        ["--pool-name", "p", "--endpoint-target-ports", "1"],
    ):
        with pytest.raises(KubernetesArgsError):
            kubernetes_config_from_args(_parse(bad))


async def test_in_cluster_configuration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    token, ca = tmp_path / "token", tmp_path / "ca.crt"
    token.write_text("sa-token")
    ca.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    c = await load_configuration(token_file=str(token), ca_file=str(ca))
    assert c.host == "https://10.96.0.1:443" and c.api_key["BearerToken"] == "Bearer sa-token"
    assert c.ssl_ca_cert == str(ca)


async def test_a_failing_handler_does_not_stop_the_watch(kube: FakeKube, tmp_path: Path) -> None:
    seen: list[str] = []

    class Fussy:
        def on_replace(self, objects: object) -> None:
            pass

        def on_upsert(self, obj: dict[str, object]) -> None:
            name = obj["metadata"]["name"]  # type: ignore[index]
            if name == "bad":
                raise RuntimeError("boom")
            seen.append(str(name))

        def on_delete(self, obj: object) -> None:
            pass

    api = await api_client(write_kubeconfig(kube, tmp_path))
    informer = Informer(api, POD_KIND, "default", Fussy())
    task = asyncio.create_task(informer.run())
    try:
        await asyncio.wait_for(informer.synced.wait(), 5)
        kube.create(PODS, pod("bad", "10.0.0.1", APP))
        kube.create(PODS, pod("good", "10.0.0.2", APP))
        await eventually(lambda: seen == ["good"], what="event after the failing one")
        assert set(informer.store) == {"bad", "good"} and informer.stats.errors == 0
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await api.close()


def test_serve_rejects_inconsistent_discovery_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from epp.cli import main

    cfg = tmp_path / "epp.yaml"
    cfg.write_text("endpoints: []\n")
    rc = main(["serve", "--config-file", str(cfg), "--endpoint-selector", "app=vllm"])
    assert rc == 1 and "--endpoint-target-ports needs 1 to 8 ports" in capsys.readouterr().err
    rc = main(["serve", "--config", str(cfg), "--pool-name", "p", "--endpoint-selector", "a=b"])
    assert rc == 1 and "exactly one of --pool-name and --endpoint-selector" in capsys.readouterr().err


async def test_streams_closed_at_once_do_not_spin(tmp_path: Path) -> None:
    kube = FakeKube(max_watch_seconds=0)
    await kube.start()
    try:
        cfg = KubernetesDiscoveryConfig(
            endpoint_selector=APP, target_ports=[8000], kubeconfig=write_kubeconfig(kube, tmp_path)
        )
        kube.create(PODS, pod("a", "10.0.0.1", APP))
        async with running_source(cfg) as (_, ds):
            await eventually(lambda: names(ds) == {"a-rank-0"})
            await asyncio.sleep(1.0)
            # Backoff 0.05 .. 0.4 s: about five watches in the first second (20+ without it, even here).
            assert 2 <= len(kube.watch_requests("pods")) <= 10
            kube.create(PODS, pod("b", "10.0.0.2", APP))  # still converges through the short streams
            await eventually(lambda: names(ds) == {"a-rank-0", "b-rank-0"})
    finally:
        await kube.stop()
