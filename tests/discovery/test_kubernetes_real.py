"""Kubernetes discovery against a real kube-apiserver + etcd (tests/discovery/realkube.py): the chart's CRDs and its
objects applied as a cluster would take them (the InferencePool validated by the real CRD schema, the EPP's service
account with the chart's RBAC), discovery run with that service account's own token, pods created, made ready and
deleted, watches restarted by the server, and a watch resumed past etcd's compaction answered `410 Gone`.
The fake API server (tests/fakekube) stays for the fast unit tests."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from epp.datalayer.datastore import Datastore
from epp.discovery.kubernetes import KubernetesDiscoveryConfig
from tests.deploy import helm
from tests.deploy.test_helm_chart import BASE, CHART, render
from tests.discovery.realkube import RealKube, real_kube
from tests.fakekube.testing import eventually, names, running_source

NS = "llm"
POOL = "qwen-pool"
LABELS = BASE["inferencePool"]["modelServers"]["matchLabels"]
PATHS = {
    "ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts",
    "ConfigMap": "/api/v1/namespaces/{ns}/configmaps",
    "Service": "/api/v1/namespaces/{ns}/services",
    "Role": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
    "RoleBinding": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
    "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
    "Deployment": "/apis/apps/v1/namespaces/{ns}/deployments",
    "InferencePool": "/apis/inference.networking.k8s.io/v1/namespaces/{ns}/inferencepools",
}
PODS = f"/api/v1/namespaces/{NS}/pods"


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[RealKube, str]]:
    """One API server for the file: the chart's CRDs and objects applied; the EPP's service-account token."""
    with real_kube() as kube:
        for crd in helm.crds(CHART):
            kube.ok("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
        for crd in helm.crds(CHART):
            path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd['metadata']['name']}"
            deadline = time.monotonic() + 30
            while not any(
                c["type"] == "Established" and c["status"] == "True"
                for c in kube.ok("GET", path).get("status", {}).get("conditions", [])
            ):
                assert time.monotonic() < deadline, crd["metadata"]["name"]
                time.sleep(0.1)
        kube.ok("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        kube.ok("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "other"}})
        docs = render(BASE, name=POOL, namespace=NS)
        for d in docs:
            kube.ok("POST", PATHS[d["kind"]].format(ns=NS), d)  # a kind the chart adds must be listed here
        (sa,) = [d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount"]
        token = kube.ok(
            "POST",
            f"/api/v1/namespaces/{NS}/serviceaccounts/{sa}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}},
        )["status"]["token"]
        yield kube, token


def pod(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai"}]},
    }


def set_ready(kube: RealKube, name: str, ip: str, ready: bool) -> None:
    """What the kubelet would report: the pod's IP and its Ready condition (the status subresource)."""
    status = {
        "phase": "Running",
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
    }
    kube.ok("PATCH", f"{PODS}/{name}/status", {"status": status})


def config(kube: RealKube, token: str, tmp: Path) -> KubernetesDiscoveryConfig:
    return KubernetesDiscoveryConfig(
        namespace=NS, pool_name=POOL, kubeconfig=kube.kubeconfig(token, tmp / "epp.kubeconfig"), watch_timeout=2
    )


def test_the_chart_objects_are_accepted_and_its_rbac_is_least_privilege(cluster: tuple[RealKube, str]) -> None:
    kube, token = cluster
    pool = kube.ok("GET", f"/apis/inference.networking.k8s.io/v1/namespaces/{NS}/inferencepools/{POOL}")
    assert pool["spec"]["selector"]["matchLabels"] == LABELS
    # the real CRD schema refuses what the schema says is wrong
    bad = {**pool, "metadata": {"name": "bad"}, "spec": {**pool["spec"], "targetPorts": [{"number": 70000}]}}
    status, out = kube.request("POST", f"/apis/inference.networking.k8s.io/v1/namespaces/{NS}/inferencepools", bad)
    assert status == 422 and "targetPorts" in str(out), out
    # the EPP's own token: it reads its namespace's pods and pools, and nothing else
    assert kube.request("GET", PODS, token=token)[0] == 200
    assert (
        kube.request("GET", f"/apis/inference.networking.k8s.io/v1/namespaces/{NS}/inferencepools", token=token)[0]
        == 200
    )
    assert kube.request("GET", "/api/v1/namespaces/other/pods", token=token)[0] == 403
    assert kube.request("POST", PODS, pod("x", LABELS), token=token)[0] == 403
    assert kube.request("GET", f"/api/v1/namespaces/{NS}/secrets", token=token)[0] == 403
    assert kube.request("GET", PODS, token="not-a-token")[0] == 401


async def test_discovery_follows_pods_with_the_epps_token(cluster: tuple[RealKube, str], tmp_path: Path) -> None:
    kube, token = cluster
    kube.ok("POST", PODS, pod("a", LABELS))
    set_ready(kube, "a", "10.1.0.1", True)
    kube.ok("POST", PODS, pod("b", LABELS))  # no IP, not ready yet
    kube.ok("POST", PODS, pod("c", {"app": "other"}))
    set_ready(kube, "c", "10.1.0.3", True)
    async with running_source(config(kube, token, tmp_path)) as (_, ds):
        await eventually(lambda: ds.synced, timeout=20, what="sync")
        await eventually(lambda: names(ds) == {"a-rank-0"}, what="the ready pod")
        ep = ds.get("a-rank-0")
        assert ep is not None and ep.hostport == "10.1.0.1:8000"
        set_ready(kube, "b", "10.1.0.2", True)
        await eventually(lambda: names(ds) == {"a-rank-0", "b-rank-0"}, what="b ready")
        set_ready(kube, "a", "10.1.0.1", False)
        await eventually(lambda: names(ds) == {"b-rank-0"}, what="a unready")
        kube.ok("DELETE", f"{PODS}/b")
        await eventually(lambda: names(ds) == set(), what="b deleted")
    for n in "ac":
        kube.ok("DELETE", f"{PODS}/{n}")


async def test_watch_restarts_and_410_gone_after_compaction(cluster: tuple[RealKube, str], tmp_path: Path) -> None:
    kube, token = cluster
    kube.ok("POST", PODS, pod("d", LABELS))
    set_ready(kube, "d", "10.1.0.4", True)
    async with running_source(config(kube, token, tmp_path)) as (source, ds):
        await eventually(lambda: names(ds) == {"d-rank-0"}, timeout=20, what="d")
        informer = source.pod_informer
        assert informer is not None
        watches = informer.stats.watches
        await eventually(lambda: informer.stats.watches >= watches + 2, timeout=15, what="server-ended watches resumed")
        assert informer.stats.relists_after_gone == 0
        # The pod watch's resume point falls behind: other objects change, then etcd compacts past it.
        for i in range(5):
            cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"churn-{i}"}, "data": {"i": str(i)}}
            kube.ok("POST", f"/api/v1/namespaces/{NS}/configmaps", cm)
        kube.compact()
        await eventually(lambda: informer.stats.relists_after_gone >= 1, timeout=15, what="410 Gone and a relist")
        kube.ok("POST", PODS, pod("e", LABELS))
        set_ready(kube, "e", "10.1.0.5", True)
        await eventually(lambda: names(ds) == {"d-rank-0", "e-rank-0"}, what="converged after the relist")
        assert informer.stats.errors >= 0
    await asyncio.sleep(0)
    for n in "de":
        kube.ok("DELETE", f"{PODS}/{n}")


async def test_without_the_chart_rbac_discovery_does_not_sync(cluster: tuple[RealKube, str], tmp_path: Path) -> None:
    """A service account the chart did not bind may not read the pool: the EPP never reports synced."""
    kube, _ = cluster
    sa = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "stranger"}}
    kube.ok("POST", f"/api/v1/namespaces/{NS}/serviceaccounts", sa)
    token = kube.ok(
        "POST",
        f"/api/v1/namespaces/{NS}/serviceaccounts/stranger/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 600}},
    )["status"]["token"]
    async with running_source(config(kube, token, tmp_path)) as (_, ds):
        await asyncio.sleep(3)
        assert not ds.synced and names(ds) == set()
    assert isinstance(ds, Datastore)
