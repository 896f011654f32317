"""InferenceObjectives for our pool flow from the cluster into the ObjectiveStore admission reads."""

from __future__ import annotations

from pathlib import Path

from epp.datalayer.objectives import ObjectiveStore
from epp.discovery.kubernetes import KubernetesDiscoveryConfig
from tests.fakekube.server import INFERENCE_OBJECTIVES, INFERENCE_POOLS, FakeKube, inference_objective, inference_pool
from tests.fakekube.testing import eventually, running_source, write_kubeconfig


async def test_objectives_follow_the_cluster(kube: FakeKube, tmp_path: Path) -> None:
    cfg = KubernetesDiscoveryConfig(pool_name="pool", kubeconfig=write_kubeconfig(kube, tmp_path))
    kube.create(INFERENCE_POOLS, inference_pool("pool", {"app": "vllm"}, [8000]))
    kube.create(INFERENCE_OBJECTIVES, inference_objective("critical", 10, "pool"))
    kube.create(INFERENCE_OBJECTIVES, inference_objective("batch", -5, "pool"))
    kube.create(INFERENCE_OBJECTIVES, inference_objective("unset", None, "pool"))
    kube.create(INFERENCE_OBJECTIVES, inference_objective("theirs", 7, "other-pool"))
    kube.create(INFERENCE_OBJECTIVES, inference_objective("wrong-group", 7, "pool", group="example.com"))
    kube.create(INFERENCE_OBJECTIVES, inference_objective("elsewhere", 7, "pool", namespace="other"))
    store = ObjectiveStore({"from-config": 3, "critical": 1})
    async with running_source(cfg, objectives=store):
        await eventually(lambda: store.priority("critical") == 10, what="initial objectives")
        assert store.names() == ["batch", "critical", "from-config", "unset"]
        assert store.priority("batch") == -5 and store.priority("unset") == 0 and store.priority("theirs") == 0
        kube.patch(INFERENCE_OBJECTIVES, "default", "batch", {"spec": {"priority": -1}})
        await eventually(lambda: store.priority("batch") == -1, what="priority update")
        kube.patch(INFERENCE_OBJECTIVES, "default", "theirs", {"spec": {"poolRef": {"name": "pool"}}})  # group defaults
        await eventually(lambda: store.priority("theirs") == 7, what="re-pointed at our pool")
        kube.patch(INFERENCE_OBJECTIVES, "default", "theirs", {"spec": {"poolRef": {"name": "gone"}}})
        await eventually(lambda: "theirs" not in store.names(), what="pointed away")
        kube.delete(INFERENCE_OBJECTIVES, "default", "critical")
        await eventually(lambda: store.priority("critical") == 1, what="config value restored")
        kube.patch(INFERENCE_OBJECTIVES, "default", "unset", {"spec": {"priority": "high"}})
        await eventually(lambda: kube.get(INFERENCE_OBJECTIVES, "default", "unset")["spec"]["priority"] == "high")
        kube.create(INFERENCE_OBJECTIVES, inference_objective("late", 2, "pool"))
        await eventually(lambda: store.priority("late") == 2)
        assert store.priority("unset") == 0  # a bad priority falls back to 0 with a log line, not a crash
