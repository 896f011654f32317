"""Composition root: build the datastore, discovery sources and director from the config."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from epp.config import EppConfig
from epp.config.builder import Pipeline, build_pipeline
from epp.config.loader import FlowControlSpec
from epp.datalayer.runtime import build_pool_reporter, build_scraper
from epp.datalayer.scraper import MetricsScraper
from epp.datastore import Datastore
from epp.discovery.base import EndpointSource
from epp.discovery.static import StaticEndpointSource
from epp.framework import PluginContext
from epp.framework.types import Endpoint
from epp.requestcontrol.director import Director
from epp.requestcontrol.flowcontrol import FlowController
from epp.requestcontrol.objectives import ObjectiveStore
from epp.requestcontrol.scheduling_director import SchedulingDirector


@dataclass
class Runtime:
    config: EppConfig
    datastore: Datastore
    director: Director
    sources: list[EndpointSource]
    # Long-running coroutines (scrapers, event pools...) the server starts and cancels on shutdown.
    background: list[Callable[[], Coroutine[Any, Any, None]]] = field(default_factory=list)
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


def build_runtime(config: EppConfig, *, sources: list[EndpointSource] | None = None) -> Runtime:
    """`sources` replaces static discovery (e.g. the Kubernetes source from `--pool-name`)."""
    datastore = Datastore()
    if sources is None:
        sources = [StaticEndpointSource(static_endpoints(config))]
    objectives = ObjectiveStore(config.objectives)
    context = PluginContext(endpoints=datastore, pool_name=config.pool_name)
    pipeline = build_pipeline(config, context)
    flow = None
    if config.gate("flowControl"):
        flow = FlowController(
            config.flow_control or FlowControlSpec(),
            pipeline.saturation_detector,
            config.pool_name,
            plugins=pipeline.plugins,
        )
    director = SchedulingDirector(datastore, pipeline, objectives, flow_controller=flow)
    scraper = build_scraper(config, pipeline.plugins, datastore)
    reporter = build_pool_reporter(config, datastore)
    background: list[Callable[[], Coroutine[Any, Any, None]]] = [scraper.run, reporter.run, *context.background]
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
