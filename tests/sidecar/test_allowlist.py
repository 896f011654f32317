"""The sidecar's SSRF allowlist follows the InferencePool's pods (the EPP's Kubernetes discovery, fake API server)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from epp.datalayer.datastore import Datastore
from epp.sidecar.allowlist import Allowlist, pool_source
from tests.fakekube.server import INFERENCE_POOLS, PODS, FakeKube, inference_pool, pod
from tests.fakekube.testing import eventually, write_kubeconfig

APP = {"app": "vllm"}


async def test_allowlist_follows_the_pools_prefill_pods(kube: FakeKube, tmp_path: Path) -> None:
    kube.create(INFERENCE_POOLS, inference_pool("pool", APP, [8000]))
    kube.create(PODS, pod("prefill-a", "10.0.0.1", {**APP, "llm-d.ai/role": "prefill"}))
    kube.create(PODS, pod("decode-a", "10.0.0.2", {**APP, "llm-d.ai/role": "decode"}))
    kube.create(PODS, pod("stranger", "10.0.0.9", {"app": "other", "llm-d.ai/role": "prefill"}))
    ds = Datastore()
    source = pool_source("default", "pool", "inference.networking.k8s.io", write_kubeconfig(kube, tmp_path))
    task = asyncio.create_task(source.run(ds))
    try:
        allow = Allowlist(True, [], ds)
        await eventually(lambda: ds.synced, what="sync")
        assert allow.allowed("10.0.0.1:8000") and allow.allowed("prefill-a:8000")
        assert not allow.allowed("10.0.0.2:8000")  # decode pod of the pool
        assert not allow.allowed("10.0.0.9:8000")  # prefill pod outside the pool
        kube.create(PODS, pod("prefill-b", "10.0.0.3", {**APP, "llm-d.ai/role": "both"}))
        await eventually(lambda: allow.allowed("10.0.0.3:8000"), what="new prefiller allowed")
        kube.delete(PODS, "default", "prefill-a")
        await eventually(lambda: not allow.allowed("10.0.0.1:8000"), what="deleted prefiller refused")
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
