"""The fake API server behaves like the real one where the informer depends on it, seen through kubernetes-asyncio."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from epp.discovery.kubeclient import api_client
from tests.fakekube.selectors import SelectorError, label_selector
from tests.fakekube.server import INFERENCE_POOLS, PODS, FakeKube, inference_pool, pod, ready_patch
from tests.fakekube.testing import write_kubeconfig


@pytest.fixture
async def api(kube: FakeKube, tmp_path: Path) -> AsyncIterator[client.ApiClient]:
    c = await api_client(write_kubeconfig(kube, tmp_path))
    yield c
    await c.close()


async def collect(w: watch.Watch, stream: Any, n: int, timeout: float = 5.0) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []

    async def run() -> None:
        async for ev in stream:
            out.append(ev)
            if len(out) == n:
                w.stop()
                break

    await asyncio.wait_for(run(), timeout)
    return out


def test_label_selector_forms() -> None:
    labels = {"app": "vllm", "tier": "gpu"}
    assert label_selector("app=vllm,tier==gpu")(labels)
    assert not label_selector("app!=vllm")(labels)
    assert label_selector("app in (vllm, sglang),tier notin (cpu)")(labels)
    assert not label_selector("app notin (vllm)")(labels)
    assert label_selector("tier")(labels) and not label_selector("!tier")(labels)
    assert label_selector("!zone")(labels)
    assert label_selector("")(labels)
    with pytest.raises(SelectorError):
        label_selector("app in (vllm")


async def test_list_filters_by_selector_and_carries_resource_versions(kube: FakeKube, api: client.ApiClient) -> None:
    kube.create(PODS, pod("a", "10.0.0.1", {"app": "vllm"}))
    kube.create(PODS, pod("b", "10.0.0.2", {"app": "other"}))
    kube.create(PODS, pod("c", "10.0.0.3", {"app": "vllm"}, namespace="elsewhere"))
    core = client.CoreV1Api(api)
    lst = await core.list_namespaced_pod("default", label_selector="app=vllm")
    assert [p.metadata.name for p in lst.items] == ["a"]
    assert lst.metadata.resource_version == str(kube.resource_version)
    assert all(p.metadata.resource_version for p in lst.items)
    lst = await core.list_namespaced_pod("default", label_selector="app in (vllm,other)")
    assert sorted(p.metadata.name for p in lst.items) == ["a", "b"]
    with pytest.raises(ApiException) as err:
        await core.list_namespaced_pod("default", label_selector="app in (x")
    assert err.value.status == 400


async def test_watch_from_rv_sends_only_newer_events_and_selector_transitions(
    kube: FakeKube, api: client.ApiClient
) -> None:
    kube.create(PODS, pod("a", "10.0.0.1", {"app": "vllm"}))
    rv = str(kube.resource_version)
    kube.create(PODS, pod("b", "10.0.0.2", {"app": "vllm"}))
    kube.create(PODS, pod("x", "10.0.0.9", {"app": "other"}))
    kube.patch(PODS, "default", "a", {"metadata": {"labels": {"app": "other"}}})  # leaves the selector
    kube.patch(PODS, "default", "x", {"metadata": {"labels": {"app": "vllm"}}})  # enters it
    kube.patch(PODS, "default", "b", ready_patch(False))
    w = watch.Watch(return_type="object")
    async with w:
        stream = w.stream(
            client.CoreV1Api(api).list_namespaced_pod, "default", label_selector="app=vllm", resource_version=rv
        )
        events = await collect(w, stream, 4)
    seen = [(e["type"], e["raw_object"]["metadata"]["name"]) for e in events]
    assert seen == [("ADDED", "b"), ("DELETED", "a"), ("ADDED", "x"), ("MODIFIED", "b")]
    rvs = [int(e["raw_object"]["metadata"]["resourceVersion"]) for e in events]
    assert rvs == sorted(rvs) and rvs[0] > int(rv)


async def test_watch_without_rv_replays_current_state_then_streams(kube: FakeKube, api: client.ApiClient) -> None:
    kube.create(PODS, pod("a", "10.0.0.1", {"app": "vllm"}))
    w = watch.Watch(return_type="object")
    async with w:
        stream = w.stream(client.CoreV1Api(api).list_namespaced_pod, "default")
        first = await collect(w, stream, 1)
        kube.delete(PODS, "default", "a")
        w._stop = False
        second = await collect(w, stream, 1)
    assert [(e["type"], e["raw_object"]["metadata"]["name"]) for e in first + second] == [
        ("ADDED", "a"),
        ("DELETED", "a"),
    ]


async def test_410_is_retried_once_by_the_client_then_raised(kube: FakeKube, api: client.ApiClient) -> None:
    kube.create(PODS, pod("a", "10.0.0.1", {"app": "vllm"}))
    stale = str(kube.resource_version)
    kube.create(PODS, pod("b", "10.0.0.2", {"app": "vllm"}))
    kube.compact()
    w = watch.Watch(return_type="object")
    async with w:
        stream = w.stream(client.CoreV1Api(api).list_namespaced_pod, "default", resource_version=stale)
        with pytest.raises(ApiException) as err:
            await collect(w, stream, 1)
    assert err.value.status == 410
    assert len(kube.watch_requests("pods")) == 2  # the library's single retry, with the same stale RV
    assert {r.query["resourceVersion"] for r in kube.watch_requests("pods")} == {stale}


async def test_bookmarks_advance_past_filtered_events(tmp_path: Path) -> None:
    kube = FakeKube(bookmark_interval=0.05)
    await kube.start()
    try:
        c = await api_client(write_kubeconfig(kube, tmp_path))
        kube.create(PODS, pod("a", "10.0.0.1", {"app": "vllm"}))
        rv = str(kube.resource_version)
        kube.create(PODS, pod("o", "10.0.0.2", {"app": "other"}))  # filtered out by the selector
        w = watch.Watch(return_type="object")
        async with w:
            stream = w.stream(
                client.CoreV1Api(c).list_namespaced_pod,
                "default",
                label_selector="app=vllm",
                resource_version=rv,
                allow_watch_bookmarks=True,
            )
            events = await collect(w, stream, 1)
        assert events[0]["type"] == "BOOKMARK"
        assert w.resource_version == str(kube.resource_version) != rv
        await c.close()
    finally:
        await kube.stop()


async def test_timeout_seconds_ends_the_stream(kube: FakeKube, api: client.ApiClient) -> None:
    w = watch.Watch(return_type="object")
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    async with w:
        async for _ in w.stream(client.CoreV1Api(api).list_namespaced_pod, "default", timeout_seconds=1):
            pass
    assert 0.9 <= loop.time() - t0 < 3


async def test_crd_paths_and_writes(kube: FakeKube, api: client.ApiClient) -> None:
    custom = client.CustomObjectsApi(api)
    g, v, plural = INFERENCE_POOLS.group, INFERENCE_POOLS.version, INFERENCE_POOLS.plural
    created = await custom.create_namespaced_custom_object(
        g, v, "default", plural, inference_pool("p", {"a": "b"}, [8000])
    )
    assert created["kind"] == "InferencePool" and created["metadata"]["resourceVersion"]
    await custom.patch_namespaced_custom_object(
        g, v, "default", plural, "p", {"spec": {"targetPorts": [{"number": 9}]}}
    )
    got = await custom.get_namespaced_custom_object(g, v, "default", plural, "p")
    assert got["spec"]["targetPorts"] == [{"number": 9}] and got["metadata"]["generation"] == 2
    lst = await custom.list_namespaced_custom_object(g, v, "default", plural, field_selector="metadata.name=p")
    assert [i["metadata"]["name"] for i in lst["items"]] == ["p"]
    await custom.delete_namespaced_custom_object(g, v, "default", plural, "p")
    with pytest.raises(ApiException) as err:
        await custom.get_namespaced_custom_object(g, v, "default", plural, "p")
    assert err.value.status == 404
    with pytest.raises(ApiException) as err:
        await custom.list_namespaced_custom_object("nope.io", "v1", "default", "things")
    assert err.value.status == 404
    with pytest.raises(ApiException) as err:
        await custom.create_namespaced_custom_object(g, v, "default", plural, inference_pool("q", {}, [1]))
        await custom.create_namespaced_custom_object(g, v, "default", plural, inference_pool("q", {}, [1]))
    assert err.value.status == 409


async def test_pod_writes_through_the_core_api(kube: FakeKube, api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    await core.create_namespaced_pod("default", pod("a", "10.0.0.1", {"app": "vllm"}))  # type: ignore[arg-type]
    await core.patch_namespaced_pod_status("a", "default", ready_patch(False))
    assert kube.get(PODS, "default", "a")["status"]["conditions"][1]["status"] == "False"
    await core.delete_namespaced_pod("a", "default", grace_period_seconds=30)
    assert kube.get(PODS, "default", "a")["metadata"]["deletionTimestamp"]
    await core.delete_namespaced_pod("a", "default", grace_period_seconds=0)
    assert kube.objects(PODS) == []


async def test_requests_need_the_bearer_token(kube: FakeKube, tmp_path: Path) -> None:
    c = await api_client(write_kubeconfig(kube, tmp_path))  # carries the old token
    kube.token = "rotated-token"
    try:
        with pytest.raises(ApiException) as err:
            await client.CoreV1Api(c).list_namespaced_pod("default")
        assert err.value.status == 401
    finally:
        await c.close()
