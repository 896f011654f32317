"""Build the data layer from the config: one MetricsScraper (one timer for every endpoint) and the pool gauges."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from epp.config.loader import EppConfig
from epp.datalayer.metrics import PoolMetricsReporter
from epp.datalayer.plugins.core_metrics_extractor import CoreMetricsExtractorPlugin
from epp.datalayer.plugins.metrics_data_source import MetricsDataSource
from epp.datalayer.scraper import MetricsScraper
from epp.framework import EndpointView, Plugin

P = TypeVar("P", bound=Plugin)


def _pick(config: EppConfig, plugins: Mapping[str, Plugin], cls: type[P], extractor: bool) -> P | None:
    """The plugin of `cls` named in dataLayer.sources (else any configured one)."""
    for src in config.data_sources:
        refs = src.extractors if extractor else [src.ref]
        for ref in refs:
            p = plugins.get(ref)
            if isinstance(p, cls):
                return p
    return next((p for p in plugins.values() if isinstance(p, cls)), None)


def build_scraper(config: EppConfig, plugins: Mapping[str, Plugin], view: EndpointView) -> MetricsScraper:
    source = _pick(config, plugins, MetricsDataSource, extractor=False)
    ext = _pick(config, plugins, CoreMetricsExtractorPlugin, extractor=True)
    return MetricsScraper(
        view,
        interval=config.refresh_metrics_interval,
        scheme=source.scheme if source else "http",
        path=source.path if source else "/metrics",
        insecure_skip_verify=source.insecure_skip_verify if source else True,
        extractor=ext.extractor if ext else None,
    )


def build_pool_reporter(config: EppConfig, view: EndpointView) -> PoolMetricsReporter:
    return PoolMetricsReporter(
        view,
        config.pool_name,
        staleness=config.metrics_staleness_threshold,
        interval=config.refresh_prometheus_metrics_interval,
    )
