"""Composition root: build the datastore, discovery sources and director from the config."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from epp.config import EppConfig
from epp.datastore import Datastore
from epp.discovery.base import EndpointSource
from epp.discovery.static import StaticEndpointSource
from epp.framework.types import Endpoint
from epp.requestcontrol.director import Director, RoundRobinDirector


@dataclass
class Runtime:
    config: EppConfig
    datastore: Datastore
    director: Director
    sources: list[EndpointSource]
    # Long-running coroutines (scrapers, event pools...) the server starts and cancels on shutdown.
    background: list[Callable[[], Coroutine[Any, Any, None]]] = field(default_factory=list)


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
    return Runtime(config=config, datastore=datastore, director=RoundRobinDirector(datastore), sources=sources)
