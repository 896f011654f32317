"""models-data-source/-extractor against a real HTTP server on loopback, and the polling sources' wiring errors and
injected defaults."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from e2e.harness.aioserve import serve_app
from epp.config.loader import ConfigError, parse_config
from epp.datalayer.datastore import Datastore
from epp.datalayer.plugins.models_data_extractor import MODELS
from epp.datalayer.plugins.models_data_source import ModelsDataSource
from epp.framework import Endpoint
from epp.wiring import build_pipeline, build_runtime, plugin_context
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


async def test_models_source_and_background_polling(exporter: int) -> None:
    ds = Datastore()
    ep = Endpoint("m-rank-0", "127.0.0.1", exporter)
    ds.replace_all([ep])
    runtime = build_runtime(parse_config(CONFIG.replace("PORT", str(exporter))))
    assert runtime.context is not None and len(runtime.context.background) >= 2  # both polling loops
    ctx = plugin_context(ds)
    pipeline = build_pipeline(parse_config(CONFIG.replace("PORT", str(exporter))), ctx)
    src = pipeline.plugins["models-data-source"]
    assert isinstance(src, ModelsDataSource)
    task = asyncio.create_task(src.run())
    for _ in range(200):
        if ep.attributes.get(MODELS):
            break
        await asyncio.sleep(0.01)
    task.cancel()
    assert ep.attributes.get(MODELS) == (("base", ""), ("lora-1", "base"))


def test_wiring_errors_and_inject_defaults() -> None:
    bad = (
        "plugins:\n- {type: dcgm-data-source}\n- {type: models-data-extractor}\n"
        "dataLayer:\n  sources:\n  - {pluginRef: dcgm-data-source, extractors: [{pluginRef: models-data-extractor}]}\n"
    )
    with pytest.raises(ConfigError, match=r"^epp\.yaml:6: dataLayer\.sources\[0\]\.extractors: models-data-extractor"):
        build_pipeline(parse_config(bad, "epp.yaml"), plugin_context(Datastore()))
    off = "plugins:\n- {type: queue-scorer}\ndataLayer:\n  injectDefaults: false\n"
    assert build_runtime(parse_config(off)).scraper is None  # no core metrics scraping, as the router
    assert build_runtime(parse_config("plugins:\n- {type: queue-scorer}\n")).scraper is not None
