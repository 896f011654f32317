"""Test helpers around the fake API server: a kubeconfig on disk, waiting for convergence, running a source."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import yaml

from epp.datalayer.datastore import Datastore
from epp.datalayer.objectives import ObjectiveStore
from epp.discovery.informer import Backoff
from epp.discovery.kubernetes import KubernetesDiscoveryConfig, KubernetesEndpointSource
from tests.fakekube.server import FakeKube


def write_kubeconfig(kube: FakeKube, directory: Path) -> str:
    path = directory / "kubeconfig.yaml"
    path.write_text(yaml.safe_dump(kube.kubeconfig()))
    return str(path)


async def eventually(pred: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def names(ds: Datastore) -> set[str]:
    return {ep.name for ep in ds.endpoints()}


def fast_backoff() -> Backoff:
    return Backoff(initial=0.05, maximum=0.4)


@contextlib.asynccontextmanager
async def running_source(
    cfg: KubernetesDiscoveryConfig,
    *,
    objectives: ObjectiveStore | None = None,
    datastore: Datastore | None = None,
) -> AsyncIterator[tuple[KubernetesEndpointSource, Datastore]]:
    ds = datastore or Datastore()
    source = KubernetesEndpointSource(cfg, objectives=objectives, backoff=fast_backoff)
    task = asyncio.create_task(source.run(ds))
    try:
        yield source, ds
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
