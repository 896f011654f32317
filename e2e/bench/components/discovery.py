"""Kubernetes discovery throughput against the fake API server, real kubernetes-asyncio client.

    python -m e2e.bench.components.discovery --pods 1000 --repeats 5

Side by side in one run: (a) initial list of N ready pods until `synced` with all endpoints, (b) N ready pods
created after sync, delivered by watch events, until converged, (c) the same N pods deleted. Prints medians and the
watch/list per-pod cost ratio. Both API server and client share this process's one core, so absolute numbers are
an upper bound on the client's cost.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import tempfile
import time
from pathlib import Path

from epp.datalayer.datastore import Datastore
from epp.discovery.kubernetes import KubernetesDiscoveryConfig, KubernetesEndpointSource
from tests.fakekube.server import INFERENCE_POOLS, PODS, FakeKube, inference_pool, pod
from tests.fakekube.testing import eventually, fast_backoff, write_kubeconfig

APP = {"app": "vllm"}


async def once(n: int, ports: int) -> tuple[float, float, float]:
    kube = FakeKube()
    await kube.start()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = KubernetesDiscoveryConfig(pool_name="pool", kubeconfig=write_kubeconfig(kube, Path(tmp)))
        kube.create(INFERENCE_POOLS, inference_pool("pool", APP, [8000 + i for i in range(ports)]))
        for i in range(n):
            kube.create(PODS, pod(f"a{i}", f"10.0.{i // 250}.{i % 250}", APP))
        ds = Datastore()
        source = KubernetesEndpointSource(cfg, backoff=fast_backoff)
        t0 = time.perf_counter()
        task = asyncio.create_task(source.run(ds))
        try:
            await eventually(lambda: ds.synced and len(ds.endpoints()) == n * ports, timeout=120, what="list")
            t_list = time.perf_counter() - t0
            t0 = time.perf_counter()
            for i in range(n):
                kube.create(PODS, pod(f"b{i}", f"10.1.{i // 250}.{i % 250}", APP))
            await eventually(lambda: len(ds.endpoints()) == 2 * n * ports, timeout=120, what="watch adds")
            t_watch = time.perf_counter() - t0
            t0 = time.perf_counter()
            for i in range(n):
                kube.delete(PODS, "default", f"b{i}")
            await eventually(lambda: len(ds.endpoints()) == n * ports, timeout=120, what="watch deletes")
            t_delete = time.perf_counter() - t0
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await kube.stop()
    return t_list, t_watch, t_delete


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--pods", type=int, default=1000)
    p.add_argument("--ports", type=int, default=1, help="targetPorts per pod (ranks)")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    runs = [asyncio.run(once(args.pods, args.ports)) for _ in range(args.repeats)]
    lst, wat, dele = (statistics.median(r[i] for r in runs) for i in range(3))
    n = args.pods
    print(f"pods={n} ports={args.ports} repeats={args.repeats} (medians)")
    print(f"initial list → synced: {lst * 1e3:8.1f} ms  {lst / n * 1e6:7.1f} µs/pod")
    print(f"watch: {n} pods added:  {wat * 1e3:8.1f} ms  {wat / n * 1e6:7.1f} µs/pod")
    print(f"watch: {n} pods deleted:{dele * 1e3:8.1f} ms  {dele / n * 1e6:7.1f} µs/pod")
    print(f"ratio watch-add / list per pod: {wat / lst:.2f}")


if __name__ == "__main__":
    main()
