"""Composition root: the datastore, the plugin context and its services, the pipeline, the director and the data
layer, built from the config. The server runs what this returns."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

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
from epp.plugins.flowcontrol.priority_then_time_eviction_order_policy import PriorityThenTimeEvictionOrderPolicy
from epp.plugins.flowcontrol.sheddable_eviction_filter import SheddableEvictionFilter
from epp.requestcontrol.director import SchedulingDirector
from epp.requestcontrol.eviction import Evictor
from epp.requestcontrol.flowcontrol import FlowController
from epp.requestcontrol.flowcontrol_spec import FlowControlSpec
from epp.requestcontrol.pipeline import Pipeline
from epp.requestcontrol.types import Director
from epp.wiring.builder import build_pipeline
from epp.wiring.builtins import register_builtins
from epp.wiring.datalayer import build_pool_reporter, build_scraper
from epp.wiring.services import EppServices

log = logging.getLogger(__name__)


@dataclass
class Runtime:
    config: EppConfig
    datastore: Datastore
    director: Director
    sources: list[EndpointSource]
    # Long-running coroutines (scrapers, event pools...) the server starts and cancels on shutdown.
    background: list[BackgroundTask] = field(default_factory=list)
    # Startup loads (tokenizers): readiness waits until every one has finished (or failed, logged).
    warmups: list[BackgroundTask] = field(default_factory=list)
    objectives: ObjectiveStore = field(default_factory=ObjectiveStore)
    pipeline: Pipeline | None = None
    scraper: MetricsScraper | None = None
    context: PluginContext | None = None
    # What the server closes after it stopped (tokenizers' HTTP sessions and gRPC channels).
    closers: list[BackgroundTask] = field(default_factory=list)

    async def close(self) -> None:
        """Release the clients the plugins' services opened; one failing closer does not stop the others."""
        for close in self.closers:
            try:
                await close()
            except Exception as e:  # a shutdown must finish; the cause is logged
                log.warning("closing %s failed: %s", getattr(close, "__qualname__", close), e)


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


def build_evictor(config: EppConfig, pipeline: Pipeline) -> Evictor:
    """flowControl.enableEviction: the sheddable filter and priority-then-time ordering (configured instances of
    those types, else their defaults), paced by how soon the saturation signal shows freed capacity."""
    plugins = pipeline.plugins.values()
    flt = next((p for p in plugins if isinstance(p, SheddableEvictionFilter)), SheddableEvictionFilter())
    order = next((p for p in plugins if isinstance(p, PriorityThenTimeEvictionOrderPolicy)), None)
    order = order or PriorityThenTimeEvictionOrderPolicy()
    if pipeline.saturation_detector.live_saturation:
        grace = 0.01  # its counts drop when the stream ends: no scrape to wait for
    else:  # a scraped signal: the next fresh scrape after the engine reclaimed the KV (llm-d's derivation)
        grace = config.refresh_metrics_interval + config.metrics_staleness_threshold + 0.25
    return Evictor(flt.eligible, order.victim_key, grace)


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
        if not isinstance(discovery, EndpointSource):
            raise ConfigError(
                f"{config.source}: dataLayer.discovery.pluginRef: {config.discovery_ref!r} is not a discovery plugin"
            )
        sources = [discovery]
    flow = None
    if config.gate("flowControl"):
        spec = config.flow_control or FlowControlSpec()
        flow = FlowController(
            spec,
            pipeline.saturation_detector,
            config.pool_name,
            plugins=pipeline.plugins,
            evictor=build_evictor(config, pipeline) if spec.enable_eviction else None,
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
        warmups=list(context.services.warmups) if isinstance(context.services, EppServices) else [],
        closers=[t.close for t in context.services.tokenizers] if isinstance(context.services, EppServices) else [],
        objectives=objectives,
        pipeline=pipeline,
        scraper=scraper,
        context=context,
    )
