"""Data-layer plugin types of EndpointPickerConfig (`dataLayer.sources`): they configure the scrapers.

`metrics-data-source` (scheme, path, insecureSkipVerify) and `core-metrics-extractor` (engineLabelKey,
defaultEngine, engineConfigs) parameterize MetricsScraper. The notification sources exist so llm-d configs
load: plugins that need endpoint changes subscribe to the Datastore through PluginContext.endpoints themselves.
"""

from __future__ import annotations

from typing import Any

from epp.datalayer.extractor import ENGINE_LABEL, CoreMetricsExtractor, EngineConfig
from epp.framework import Params, Plugin, PluginConfigError, register


@register("metrics-data-source")
class MetricsDataSource(Plugin):
    def __init__(
        self, name: str | None = None, scheme: str = "http", path: str = "/metrics", insecure: bool = True
    ) -> None:
        super().__init__(name)
        self.scheme = scheme
        self.path = path
        self.insecure_skip_verify = insecure

    @classmethod
    def from_config(cls, name: str, parameters: dict[str, Any], context: Any) -> MetricsDataSource:
        p = Params(name, parameters)
        return cls(
            name,
            scheme=p.str("scheme", "http", choices=("http", "https")),
            path=p.str("path", "/metrics"),
            insecure=p.bool("insecureSkipVerify", True),
        )


@register("core-metrics-extractor")
class CoreMetricsExtractorPlugin(Plugin):
    def __init__(self, name: str | None = None, extractor: CoreMetricsExtractor | None = None) -> None:
        super().__init__(name)
        self.extractor = extractor or CoreMetricsExtractor()

    @classmethod
    def from_config(cls, name: str, parameters: dict[str, Any], context: Any) -> CoreMetricsExtractorPlugin:
        p = Params(name, parameters)
        engines: dict[str, EngineConfig] = {}
        for i, e in enumerate(p.list("engineConfigs")):
            where = f"{name}: engineConfigs[{i}]"
            if not isinstance(e, dict) or not isinstance(e.get("name"), str):
                raise PluginConfigError(f"{where}: needs a name", key="engineConfigs")
            specs = {}
            for key in ("queuedRequestsSpec", "runningRequestsSpec", "kvUsageSpec", "loraSpec", "cacheInfoSpec"):
                v = e.get(key, "")
                if not isinstance(v, str):
                    raise PluginConfigError(f"{where}.{key}: expected a string, got {v!r}", key="engineConfigs")
                specs[key] = v
            try:
                engines[e["name"]] = EngineConfig.from_specs(
                    e["name"],
                    specs["queuedRequestsSpec"],
                    specs["runningRequestsSpec"],
                    specs["kvUsageSpec"],
                    specs["loraSpec"],
                    specs["cacheInfoSpec"],
                )
            except ValueError as err:
                raise PluginConfigError(f"{where}: {err}", key="engineConfigs") from None
        default = p.str("defaultEngine", "vllm")
        extractor = CoreMetricsExtractor(engines, p.str("engineLabelKey", ENGINE_LABEL), default)
        if default not in extractor.engines:
            msg = f"{name}: parameter 'defaultEngine': unknown engine {default!r}"
            raise PluginConfigError(msg, key="defaultEngine")
        return cls(name, extractor)


@register("endpoint-notification-source", "k8s-notification-source")
class NotificationSource(Plugin):
    @classmethod
    def from_config(cls, name: str, parameters: dict[str, Any], context: Any) -> NotificationSource:
        return cls(name)
