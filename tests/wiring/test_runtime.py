"""Kubernetes discovery inside the real runtime: pods that come and go start and stop their metrics scrapers."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from aiohttp import web

from epp.config import parse_config
from epp.discovery.kubernetes import KubernetesDiscoveryConfig, KubernetesEndpointSource
from epp.framework import Plugin
from epp.wiring.runtime import build_runtime
from tests.fakekube.server import INFERENCE_OBJECTIVES, INFERENCE_POOLS, PODS, FakeKube, inference_objective, pod
from tests.fakekube.server import inference_pool as pool_obj
from tests.fakekube.testing import eventually, fast_backoff, names, write_kubeconfig

METRICS = "vllm:num_requests_waiting 3\nvllm:num_requests_running 1\nvllm:kv_cache_usage_perc 0.25\n"


async def metrics_page(_: web.Request) -> web.Response:
    return web.Response(text=METRICS)


async def metrics_site(runner: web.AppRunner) -> int:
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return int(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]


async def test_scrapers_follow_discovered_pods(tmp_path: Path) -> None:
    app = web.Application()
    app.router.add_get("/metrics", metrics_page)
    runner = web.AppRunner(app)
    await runner.setup()
    ports = [await metrics_site(runner), await metrics_site(runner)]
    kube = FakeKube()
    await kube.start()
    cfg = KubernetesDiscoveryConfig(pool_name="pool", kubeconfig=write_kubeconfig(kube, tmp_path))
    source = KubernetesEndpointSource(cfg, backoff=fast_backoff)
    config = parse_config("poolName: pool\nobjectives: [{name: from-file, priority: 1}]\n")
    runtime = build_runtime(config, sources=[source])
    source.objectives = runtime.objectives
    assert runtime.scraper is not None
    scraper = runtime.scraper
    kube.create(INFERENCE_POOLS, pool_obj("pool", {"app": "vllm"}, ports))
    kube.create(PODS, pod("a", "127.0.0.1", {"app": "vllm"}))
    kube.create(INFERENCE_OBJECTIVES, inference_objective("critical", 5, "pool"))
    tasks = [asyncio.create_task(source.run(runtime.datastore)), asyncio.create_task(scraper.run())]
    try:
        ds = runtime.datastore
        await eventually(lambda: scraper.running() == ["a-rank-0", "a-rank-1"], what="scrapers started")
        await eventually(lambda: all(ep.metrics.waiting_queue_size == 3 for ep in ds.endpoints()), what="scraped")
        assert runtime.objectives.priority("critical") == 5 and runtime.objectives.priority("from-file") == 1
        kube.patch(
            PODS,
            "default",
            "a",
            {"metadata": {"annotations": {"inference.networking.k8s.io/active-ports": str(ports[1])}}},
        )
        await eventually(lambda: scraper.running() == ["a-rank-1"], what="rank 0 scraper stopped")
        kube.delete(PODS, "default", "a")
        await eventually(lambda: scraper.running() == [] and names(ds) == set(), what="all scrapers stopped")
        scrape_tasks = [t for t in asyncio.all_tasks() if t.get_name().startswith("scrape ")]
        await eventually(lambda: all(t.done() for t in scrape_tasks), what="scrape tasks finished")
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        await kube.stop()
        await runner.cleanup()


def test_eviction_waits_for_a_scrape_unless_the_detector_counts_live() -> None:
    """live_saturation (concurrency-detector) paces eviction by the stream's end; a scraped signal waits for the
    next fresh scrape."""
    from epp.datalayer.datastore import Datastore
    from epp.wiring import build_pipeline, plugin_context
    from epp.wiring.runtime import build_evictor

    def grace(detector: str) -> float:
        cfg = parse_config(f"plugins: [{{type: queue-scorer}}, {{type: {detector}}}]")
        pipeline = build_pipeline(cfg, plugin_context(Datastore()))
        assert isinstance(pipeline.saturation_detector, Plugin) and pipeline.saturation_detector.type_name == detector
        return build_evictor(cfg, pipeline).grace

    cfg = parse_config("{}")
    assert grace("concurrency-detector") == 0.01
    assert grace("utilization-detector") == cfg.refresh_metrics_interval + cfg.metrics_staleness_threshold + 0.25
