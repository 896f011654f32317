"""dcgm-data-source/-extractor against a real node-exporter-style HTTP server on loopback, wired by the builder from
dataLayer.sources; endpoint-attribute-filter reads the GPU utilization they produce."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from e2e.harness.aioserve import serve_app
from epp.config.loader import parse_config
from epp.datalayer.datastore import Datastore
from epp.datalayer.plugins.dcgm_data_source import DCGMDataSource
from epp.framework import ApiKind, CycleState, DataKey, Endpoint, InferenceRequest
from epp.wiring import build_pipeline, plugin_context
from tests.datalayer.plugins.support_polling import CONFIG, DCGM_PAGE


@pytest.fixture
async def exporter() -> AsyncIterator[int]:
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=DCGM_PAGE)

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "base"}, {"id": "lora-1", "parent": "base"}]})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/models", models)
    async with serve_app(app) as port:
        yield port


async def test_gpu_utilization_from_the_node_exporter_filters_endpoints(exporter: int) -> None:
    ds = Datastore()
    a = Endpoint("vllm-a-rank-0", "10.9.9.1", 8000, pod_name="vllm-a", node_address="127.0.0.1")
    b = Endpoint("vllm-b-rank-0", "10.9.9.2", 8000, pod_name="vllm-b", node_address="127.0.0.1")
    ds.replace_all([a, b])
    ctx = plugin_context(ds)
    pipeline = build_pipeline(parse_config(CONFIG.replace("PORT", str(exporter))), ctx)
    source = pipeline.plugins["dcgm"]
    assert isinstance(source, DCGMDataSource) and [e.name for e in source.extractors] == ["dcgm-extractor"]
    async with aiohttp.ClientSession() as session:
        await source.poll_once(session)
    key = DataKey[float]("GPUUtilization").of("dcgm-extractor")
    assert a.attributes.get(key) == pytest.approx(0.91) and b.attributes.get(key) == pytest.approx(0.20)
    flt = pipeline.plugins["endpoint-attribute-filter"]
    request = InferenceRequest("r", "/v1/completions", ApiKind.COMPLETIONS, "m", "m", {})
    assert flt.filter(CycleState(), request, [a, b]) == [b]  # type: ignore[attr-defined]
