"""Composition root: the datastore, the plugin context and its services, the pipeline, the director and the data
layer, built from the config. The server runs what this returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

from epp.config import ConfigError, EppConfig
from epp.datalayer.datastore import Datastore
from epp.datalayer.objectives import ObjectiveStore
from epp.datalayer.plugins.metrics_data_source import MetricsDataSource
from epp.datalayer.scraper import MetricsScraper
from epp.discovery.base import EndpointSource
from epp.discovery.static import StaticEndpointSource
from epp.framework import EndpointView, PluginContext
from epp.framework.context import BackgroundTask
from epp.framework.types import Endpoint
from epp.requestcontrol.director import SchedulingDirector
from epp.requestcontrol.flowcontrol import FlowController
from epp.requestcontrol.flowcontrol_spec import FlowControlSpec
from epp.requestcontrol.pipeline import Pipeline
from epp.requestcontrol.types import Director
from epp.wiring.builder import build_pipeline
from epp.wiring.builtins import register_builtins
from epp.wiring.datalayer import build_pool_reporter, build_scraper
from epp.wiring.services import EppServices


@dataclass
class Runtime:
    config: EppConfig
    datastore: Datastore
    director: Director
    sources: list[EndpointSource]
    # Long-running coroutines (scrapers, event pools...) the server starts and cancels on shutdown.
    background: list[BackgroundTask] = field(default_factory=list)
    objectives: ObjectiveStore = field(default_factory=ObjectiveStore)
    pipeline: Pipeline | None = None
    scraper: MetricsScraper | None = None
    context: PluginContext | None = None


def static_endpoints(config: EppConfig) -> list[Endpoint]:
    return [
        Endpoint(
            name=spec.name or f"{spec.address}:{spec.port}",
            address=spec.address,
            port=spec.port,
            labels=dict(spec.labels),
            metrics_port=spec.metrics_port,
        )
        for spec in config.endpoints
    ]


def plugin_context(endpoints: EndpointView, pool_name: str = "default") -> PluginContext:
    """A PluginContext with the EPP's real services (KV-block index, tokenizers)."""
    background: list[BackgroundTask] = []
    return PluginContext(
        endpoints=endpoints,
        services=EppServices(endpoints, background),
        pool_name=pool_name,
        background=background,
    )


def build_runtime(config: EppConfig, *, sources: list[EndpointSource] | None = None) -> Runtime:
    """`sources` replaces static discovery (e.g. the Kubernetes source from `--pool-name`)."""
    register_builtins()
    datastore = Datastore()
    if sources is None:
        sources = [StaticEndpointSource(static_endpoints(config))]
    objectives = ObjectiveStore(config.objectives)
    context = plugin_context(datastore, config.pool_name)
    pipeline = build_pipeline(config, context)
    if config.discovery_ref is not None:  # dataLayer.discovery: the plugin is the endpoint source
        discovery = pipeline.plugins[config.discovery_ref]
        if not callable(getattr(discovery, "run", None)):
            raise ConfigError(
                f"{config.source}: dataLayer.discovery.pluginRef: {config.discovery_ref!r} is not a discovery plugin"
            )
        sources = [cast(EndpointSource, discovery)]
    flow = None
    if config.gate("flowControl"):
        flow = FlowController(
            config.flow_control or FlowControlSpec(),
            pipeline.saturation_detector,
            config.pool_name,
            plugins=pipeline.plugins,
        )
    director = SchedulingDirector(datastore, pipeline, objectives, flow_controller=flow)
    scraper: MetricsScraper | None = build_scraper(config, pipeline.plugins, datastore)
    reporter = build_pool_reporter(config, datastore)
    background: list[BackgroundTask] = [reporter.run, *context.background]
    # dataLayer.injectDefaults: false without a metrics-data-source: the core metrics are not scraped (llm-d-router)
    if config.inject_data_defaults is not False or any(
        isinstance(p, MetricsDataSource) for p in pipeline.plugins.values()
    ):
        assert scraper is not None
        background.insert(0, scraper.run)
    else:
        scraper = None
    return Runtime(
        config=config,
        datastore=datastore,
        director=director,
        sources=sources,
        background=background,
        objectives=objectives,
        pipeline=pipeline,
        scraper=scraper,
        context=context,
    )
