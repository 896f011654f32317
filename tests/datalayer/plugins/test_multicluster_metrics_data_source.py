"""multicluster-metrics-data-source + -extractor against real HTTP(S) servers on loopback playing two clusters' EPP
/metrics pages, wired by the builder from llm-d's hub-load guide config: the pool averages land as the attributes
the multicluster scorers read, https verifies the peer by default, a page is bounded, and the scorers without the
extractor fail the load."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import AsyncIterator, Callable
from functools import partial
from pathlib import Path

import pytest
from aiohttp import web

from e2e.harness.aioserve import serve_app
from epp.config import ConfigError
from epp.config.loader import parse_config
from epp.datalayer.datastore import Datastore
from epp.datalayer.plugins.multicluster_metrics_data_source import MultiClusterMetricsDataSource
from epp.framework import ApiKind, CycleState, Endpoint, InferenceRequest, PluginContext
from epp.framework.keys import MULTICLUSTER_KV_CACHE_UTILIZATION, MULTICLUSTER_QUEUE_SIZE
from epp.requestcontrol.pipeline import Pipeline
from epp.server.tls import self_signed_dir
from epp.wiring import build_pipeline, plugin_context

ROOT = Path(__file__).resolve().parents[3]
HUB_LOAD = ROOT / "tests" / "corpus" / "anchors" / "llm-d__guides__multi-cluster-routing__router__hub-load.values.yaml"


def page(kv: float, queue: float, pool: str = "p") -> str:
    return (
        "# TYPE llm_d_epp_average_kv_cache_utilization gauge\n"
        f'llm_d_epp_average_kv_cache_utilization{{name="{pool}"}} {kv}\n'
        "# TYPE llm_d_epp_average_queue_size gauge\n"
        f'llm_d_epp_average_queue_size{{name="{pool}"}} {queue}\n'
        f'inference_pool_average_queue_size{{name="{pool}"}} 999\n'
    )


class Cluster:
    """One cluster EPP's /metrics (its page can be changed; `hits` counts scrapes)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.hits = 0

    async def metrics(self, _: web.Request) -> web.Response:
        self.hits += 1
        return web.Response(text=self.text)


@pytest.fixture
async def clusters() -> AsyncIterator[tuple[list[Cluster], list[int]]]:
    a, b = Cluster(page(0.8, 6)), Cluster(page(0.2, 1))
    apps = []
    for c in (a, b):
        app = web.Application()
        app.router.add_get("/metrics", c.metrics)
        apps.append(app)
    async with serve_app(apps[0], access_log=False) as pa, serve_app(apps[1], access_log=False) as pb:
        yield [a, b], [pa, pb]


def clusters_file(tmp: Path, metrics_ports: list[int]) -> Path:
    """Two clusters as the guide's clusters.yaml lists them: a gateway address and the EPP's metrics labels."""
    f = tmp / "clusters.yaml"
    lines = ["endpoints:"]
    for i, port in enumerate(metrics_ports):
        lines += [
            f"  - name: cluster-{'ab'[i]}",
            "    address: 127.0.0.1",
            f'    port: "{8000 + i}"',
            "    labels:",
            "      metricsAddress: 127.0.0.1",
            f'      metricsPort: "{port}"',
        ]
    f.write_text("\n".join(lines) + "\n")
    return f


def hub(text: str) -> tuple[Pipeline, Datastore, PluginContext]:
    ds = Datastore()
    context = plugin_context(ds)
    return build_pipeline(parse_config(text, "hub.yaml"), context), ds, context


async def until(check: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.02)


def guide_config(clusters_path: Path, **source: str) -> str:
    """llm-d's hub-load guide config as shipped, with the cluster list's path (and the source's parameters) set."""
    text = HUB_LOAD.read_text().replace("/etc/epp/clusters/clusters.yaml", str(clusters_path))
    extra = "".join(f"\n      {k}: {v}" for k, v in source.items())
    return text.replace("      scheme: http\n", f"      scheme: http\n      interval: 50ms{extra}\n", 1)


async def test_the_hub_load_guide_scores_clusters_on_their_pool_averages(
    tmp_path: Path, clusters: tuple[list[Cluster], list[int]]
) -> None:
    (a, b), ports = clusters
    pipeline, ds, context = hub(guide_config(clusters_file(tmp_path, ports)))
    discovery = pipeline.plugins["discovery"]
    tasks = [asyncio.create_task(discovery.run(ds))]  # type: ignore[attr-defined]
    tasks += [asyncio.create_task(t()) for t in context.background]
    try:
        await until(lambda: len(ds.endpoints()) == 2)
        eps = {ep.name: ep for ep in ds.endpoints()}
        assert eps["cluster-b"].hostport == "127.0.0.1:8001"  # requests go to the gateway...
        assert eps["cluster-b"].metrics_hostport == f"127.0.0.1:{ports[1]}"  # ...metrics come from the EPP
        await until(lambda: all(ep.attributes.get(MULTICLUSTER_QUEUE_SIZE) is not None for ep in eps.values()))
        assert eps["cluster-a"].attributes.get(MULTICLUSTER_KV_CACHE_UTILIZATION) == 0.8
        assert eps["cluster-a"].attributes.get(MULTICLUSTER_QUEUE_SIZE) == 6.0  # not the GIE-named 999
        profile = pipeline.scheduler.profiles["default"]
        order = [eps["cluster-a"], eps["cluster-b"]]
        scores = {s.scorer.name: list(s.scorer.score(CycleState(), request(), order)) for s in profile.scorers}
        assert scores == {"kv-cache": pytest.approx([0.2, 0.8]), "queue": [0.0, 1.0]}
        # the load moves: the hub follows on its next scrapes
        a.text, b.text = page(0.1, 0), page(0.9, 9)
        await until(lambda: eps["cluster-b"].attributes.get(MULTICLUSTER_QUEUE_SIZE) == 9.0)
        await until(lambda: eps["cluster-a"].attributes.get(MULTICLUSTER_QUEUE_SIZE) == 0.0)
        queue = next(s.scorer for s in profile.scorers if s.scorer.name == "queue")
        assert list(queue.score(CycleState(), request(), order)) == [1.0, 0.0]
        # a page without the metric keeps the last value (llm-d-router's extractor writes only what it finds)
        a.text = "other_metric 1\n"
        hits = a.hits
        await until(lambda: a.hits >= hits + 2)
        assert eps["cluster-a"].attributes.get(MULTICLUSTER_QUEUE_SIZE) == 0.0
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def request() -> InferenceRequest:
    return InferenceRequest("r", "/v1/completions", ApiKind.COMPLETIONS, "m", "m", {}, prompt="hi")


def test_a_cluster_without_the_attribute_scores_zero() -> None:
    pipeline, _, _ = hub(HUB_LOAD.read_text())
    with_load, without = Endpoint("a", "10.0.0.1", 80), Endpoint("b", "10.0.0.2", 80)
    with_load.attributes.put(MULTICLUSTER_QUEUE_SIZE, 3.0)
    with_load.attributes.put(MULTICLUSTER_KV_CACHE_UTILIZATION, 0.5)
    for s in pipeline.scheduler.profiles["default"].scorers:
        assert list(s.scorer.score(CycleState(), request(), [with_load, without])) == [
            0.5 if s.scorer.name == "kv-cache" else 1.0,
            0.0,
        ]


def test_the_scorers_without_the_extractor_fail_the_load() -> None:
    """llm-d-router's #2255 guard: the metric scorers' attributes need a producer."""
    text = HUB_LOAD.read_text().replace("  - type: multicluster-metrics-extractor\n    name: metrics-extractor\n", "")
    text = text.replace("      extractors:\n        - pluginRef: metrics-extractor\n", "")
    with pytest.raises(ConfigError, match=r"multicluster-kv-cache-utilization-scorer 'kv-cache' needs llm-d\.ai/"):
        hub(text)


async def test_https_verifies_the_peer_by_default(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    certs = self_signed_dir("cluster-b")
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(certs / "tls.crt", certs / "tls.key")
    cluster = Cluster(page(0.3, 2))
    app = web.Application()
    app.router.add_get("/metrics", cluster.metrics)
    caplog.set_level(logging.WARNING)
    async with serve_app(app, ssl_context=server_tls, access_log=False) as port:
        for params, verified in (
            ("", False),  # https by default, the peer's self-signed certificate is not trusted
            (f"{{caCertPath: {certs / 'tls.crt'}}}", True),
            ("{insecureSkipVerify: true}", True),
        ):
            ds = Datastore()
            ep = Endpoint("cluster-b", "127.0.0.1", port)
            ds.replace_all([ep])
            text = f"""plugins:
- {{type: multicluster-metrics-data-source, name: src, parameters: {params or "{}"}}}
- {{type: multicluster-metrics-extractor, name: ex}}
dataLayer:
  sources: [{{pluginRef: src, extractors: [{{pluginRef: ex}}]}}]
"""
            pipeline = build_pipeline(parse_config(text), plugin_context(ds))
            src = pipeline.plugins["src"]
            assert isinstance(src, MultiClusterMetricsDataSource) and src.scheme == "https"
            src.interval = 0.02
            task = asyncio.create_task(src.run())
            try:
                await until(partial(lambda s: s.polls >= 2, src))
                assert (ep.attributes.get(MULTICLUSTER_QUEUE_SIZE) == 2.0) is verified, params
                assert (src.failures > 0) is not verified
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
    said = [r.getMessage() for r in caplog.records if "polling https://127.0.0.1" in r.getMessage()]
    assert len(said) == 1 and "CERTIFICATE_VERIFY_FAILED" in said[0], said  # once, not per scrape


def test_tls_files_that_cannot_be_loaded_fail_the_config(tmp_path: Path) -> None:
    base = "plugins:\n- {type: multicluster-metrics-data-source, parameters: %s}\n"
    with pytest.raises(ConfigError, match="parameter 'caCertPath': cannot load"):
        hub(base % f"{{caCertPath: {tmp_path / 'none.crt'}}}")
    with pytest.raises(ConfigError, match="clientCertPath and clientKeyPath go together"):
        hub(base % "{clientCertPath: /x.crt}")
    with pytest.raises(ConfigError, match="invalid metric spec"):
        hub("plugins:\n- {type: multicluster-metrics-extractor, parameters: {queueSizeMetric: 'a b'}}\n")


async def test_a_page_is_read_up_to_8_mib(clusters: tuple[list[Cluster], list[int]]) -> None:
    (a, _), ports = clusters
    a.text = page(0.5, 4) + "# " + "x" * (9 << 20) + "\n" + 'llm_d_epp_average_kv_cache_utilization{name="q"} 0.9\n'
    ds = Datastore()
    ep = Endpoint("cluster-a", "127.0.0.1", ports[0])
    ds.replace_all([ep])
    text = """plugins:
- {type: multicluster-metrics-data-source, name: src, parameters: {scheme: http, interval: 20ms}}
- type: multicluster-metrics-extractor
  name: ex
  parameters: {kvCacheUtilizationMetric: 'llm_d_epp_average_kv_cache_utilization{name="q"}'}
dataLayer:
  sources: [{pluginRef: src, extractors: [{pluginRef: ex}]}]
"""
    pipeline = build_pipeline(parse_config(text), plugin_context(ds))
    src = pipeline.plugins["src"]
    assert isinstance(src, MultiClusterMetricsDataSource)
    task = asyncio.create_task(src.run())
    try:
        await until(lambda: ep.attributes.get(MULTICLUSTER_QUEUE_SIZE) == 4.0)
        await until(lambda: a.hits >= 3)
        assert ep.attributes.get(MULTICLUSTER_KV_CACHE_UTILIZATION) is None  # past the 8 MiB: never read
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
