"""core-metrics-extractor (GIE): which Prometheus families give queue, running, KV usage, LoRA and cache info, per
engine (`engineLabelKey` picks the engine of a pod; `defaultEngine`, `engineConfigs` add or override engines).
pyepp adds `prefixCacheQueriesSpec`/`prefixCacheHitsSpec`: the prefix-cache counters the delivered-hits loop reads."""

from __future__ import annotations

from typing import Self

from epp.datalayer.extractor import ENGINE_LABEL, CoreMetricsExtractor, EngineConfig
from epp.framework import Params, Plugin, PluginConfigError, PluginContext

_SPEC_KEYS = (
    "queuedRequestsSpec",
    "runningRequestsSpec",
    "kvUsageSpec",
    "loraSpec",
    "cacheInfoSpec",
    "prefixCacheQueriesSpec",
    "prefixCacheHitsSpec",
)


class CoreMetricsExtractorPlugin(Plugin):
    type_name = "core-metrics-extractor"

    def __init__(self, name: str | None = None, extractor: CoreMetricsExtractor | None = None) -> None:
        super().__init__(name)
        self.extractor = extractor or CoreMetricsExtractor()

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        engines: dict[str, EngineConfig] = {}
        for i, e in enumerate(params.list("engineConfigs")):
            where = f"{name}: engineConfigs[{i}]"
            if not isinstance(e, dict) or not isinstance(e.get("name"), str):
                raise PluginConfigError(f"{where}: needs a name", key="engineConfigs")
            unknown = [k for k in e if k != "name" and k not in _SPEC_KEYS]
            if unknown:
                raise PluginConfigError(f"{where}: unknown key {unknown[0]!r}", key="engineConfigs")
            specs = {}
            for key in _SPEC_KEYS:
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
                    prefix_queries=specs["prefixCacheQueriesSpec"],
                    prefix_hits=specs["prefixCacheHitsSpec"],
                )
            except ValueError as err:
                raise PluginConfigError(f"{where}: {err}", key="engineConfigs") from None
        default = params.str("defaultEngine", "vllm")
        extractor = CoreMetricsExtractor(engines, params.str("engineLabelKey", ENGINE_LABEL), default)
        if default not in extractor.engines:
            msg = f"{name}: parameter 'defaultEngine': unknown engine {default!r}"
            raise PluginConfigError(msg, key="defaultEngine")
        return cls(name, extractor)
