"""200 pods created, readied, flapped and deleted (with a cut watch and a 410 in between): the datastore converges
to exactly the ready pods and nothing is left behind (endpoints, listener bookkeeping, tasks, watches)."""

from __future__ import annotations

import asyncio
import contextlib
import random
from pathlib import Path

from epp.datalayer.datastore import Datastore
from epp.discovery.kubernetes import KubernetesDiscoveryConfig, KubernetesEndpointSource
from epp.framework import Endpoint
from tests.fakekube.server import INFERENCE_POOLS, PODS, FakeKube, inference_pool, pod, ready_patch
from tests.fakekube.testing import eventually, fast_backoff, names, write_kubeconfig

APP = {"app": "vllm"}
N = 200


class LiveSet:
    """What a listener (scraper pool, KV subscriber) believes exists; double adds or unknown removes are bugs."""

    def __init__(self) -> None:
        self.live: set[str] = set()
        self.problems: list[str] = []

    def endpoint_added(self, ep: Endpoint) -> None:
        if ep.name in self.live:
            self.problems.append(f"double add {ep.name}")
        self.live.add(ep.name)

    def endpoint_updated(self, ep: Endpoint) -> None:
        if ep.name not in self.live:
            self.problems.append(f"update of unknown {ep.name}")

    def endpoint_removed(self, ep: Endpoint) -> None:
        if ep.name not in self.live:
            self.problems.append(f"remove of unknown {ep.name}")
        self.live.discard(ep.name)


def expected(kube: FakeKube) -> set[str]:
    out: set[str] = set()
    for p in kube.objects(PODS, "default"):
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"]["conditions"])
        if ready and not p["metadata"].get("deletionTimestamp") and p["metadata"]["labels"].get("app") == "vllm":
            out |= {f"{p['metadata']['name']}-rank-0", f"{p['metadata']['name']}-rank-1"}
    return out


async def test_churn_converges_without_leaks(tmp_path: Path) -> None:
    rng = random.Random(7)
    baseline = asyncio.all_tasks()
    kube = FakeKube(bookmark_interval=0.2)
    await kube.start()
    ds = Datastore()
    live = LiveSet()
    ds.subscribe(live)
    cfg = KubernetesDiscoveryConfig(pool_name="pool", kubeconfig=write_kubeconfig(kube, tmp_path), watch_timeout=5)
    source = KubernetesEndpointSource(cfg, backoff=fast_backoff)
    task = asyncio.create_task(source.run(ds))
    try:
        kube.create(INFERENCE_POOLS, inference_pool("pool", APP, [8000, 8001]))
        order = list(range(N))
        rng.shuffle(order)
        for i in order:
            labels = APP if i % 10 else {"app": "noise"}
            kube.create(PODS, pod(f"p{i}", f"10.{i // 250}.{i % 250}.1", labels, ready=False))
            if i % 17 == 0:
                await asyncio.sleep(0)
        await eventually(lambda: ds.synced, what="sync")
        rng.shuffle(order)
        for n, i in enumerate(order):
            kube.patch(PODS, "default", f"p{i}", ready_patch(True))
            if i % 7 == 0:
                kube.patch(PODS, "default", f"p{i}", ready_patch(False))
            if n == N // 2:
                kube.cut_watches()  # a dropped connection mid-churn: resume from the last RV
            if n % 25 == 0:
                await asyncio.sleep(0.01)
        await eventually(lambda: names(ds) == expected(kube), timeout=20, what="readied pods")
        informer = source.pod_informer
        assert informer is not None
        # Miss a burst of deletions while disconnected, then make the RV expire: the re-list must drop them.
        kube.fail_next(1, when=lambda r: r.path.endswith("/pods"))
        kube.cut_watches()
        rng.shuffle(order)
        for i in order[: N // 2]:
            kube.delete(PODS, "default", f"p{i}", graceful=(i % 2 == 0))
        kube.compact()
        for i in order[N // 2 : N // 2 + 50]:
            kube.delete(PODS, "default", f"p{i}")
        for j in range(20):
            kube.create(PODS, pod(f"new{j}", f"10.9.{j}.1", APP))
        await eventually(lambda: names(ds) == expected(kube), timeout=20, what="after deletions")
        assert informer.stats.relists_after_gone >= 1 and informer.stats.watches >= 3
        assert len(names(ds)) > 100
        assert live.live == names(ds) and not live.problems
        ready_pods = {e.rsplit("-rank-", 1)[0] for e in expected(kube)}
        assert source._pods is not None and source._pods.pod_count == len(ready_pods)
        # Everything goes away.
        for p in kube.objects(PODS, "default"):
            kube.delete(PODS, "default", p["metadata"]["name"])
        await eventually(lambda: names(ds) == set(), timeout=20, what="empty")
        assert source._pods.pod_count == 0 and informer.store == {}
        assert len(ds._by_hostport) == 0 and live.live == set() and not live.problems
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    assert source._api is None and source._pod_task is None and not source._retired
    await eventually(lambda: kube.open_watches == 0, what="watches closed server-side")
    await kube.stop()
    await asyncio.sleep(0)
    leftover = {t for t in asyncio.all_tasks() - baseline if not t.done()} - {asyncio.current_task()}
    assert not leftover, leftover
    assert len(ds._listeners) == 1
