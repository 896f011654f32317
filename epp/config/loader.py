"""Load the config file: GIE/llm-d's EndpointPickerConfig plus our extension keys.

Extension keys: `endpoints` (static discovery), `modelRewrites`, `objectives` ([{name, priority}]),
`refreshMetricsInterval`, `metricsStalenessThreshold`, `refreshPrometheusMetricsInterval`, `poolName`.
This module checks structure and references and fills in GIE's defaults; plugin types and parameters are
checked when the plugins are built (epp.wiring.builder), with the same key-and-line error messages.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from epp.config.yamlmarks import line_of, load_marked
from epp.framework.params import parse_duration
from epp.requestcontrol.flowcontrol_spec import FlowControlSpec, PriorityBandSpec

log = logging.getLogger(__name__)

API_VERSIONS = (
    "inference.networking.x-k8s.io/v1alpha1",
    "llm-d.ai/v1alpha1",
    "llm-d.ai/v1",  # llm-d's current guides write it
    "config.x-k8s.io/v1alpha1",
)
KIND = "EndpointPickerConfig"
# Feature gates and their defaults (GIE v1.5 and llm-d-router v0.10 register these); a gate is written `name`
# (on) or `name=<bool>` as Go's strconv.ParseBool reads it.
FEATURE_GATE_DEFAULTS: dict[str, bool] = {
    "dataLayer": False,
    "enableLegacyMetrics": False,
    "flowControl": False,
    "prepareDataPlugins": False,
    "haPopulateNonLeaderDatastore": True,
}
FEATURE_GATES = tuple(FEATURE_GATE_DEFAULTS)
_GO_BOOLS = {"1": True, "t": True, "true": True, "0": False, "f": False, "false": False}
GIE_KEYS = (
    "apiVersion",
    "kind",
    "featureGates",
    "plugins",
    "schedulingProfiles",
    "saturationDetector",
    "dataLayer",
    "data",
    "flowControl",
    "parser",
    "requestHandler",
)
# Our keys; other parts of the EPP may append theirs (any other top-level key is an error).
EXTENSION_KEYS: list[str] = [
    "endpoints",
    "modelRewrites",
    "objectives",
    "refreshMetricsInterval",
    "metricsStalenessThreshold",
    "refreshPrometheusMetricsInterval",
    "poolName",
]

# pyepp's default, used when the file configures no plugins at all: config/pyepp-default.yaml (the file is the source;
# tests/config/test_loader_default.py keeps this copy equal to it). The precise producer's approximateFallback
# routes pods without KV events on the EPP's routing history, as GIE's approximate default would.
DEFAULT_PLUGINS_YAML = """
plugins:
- type: precise-prefix-cache-producer
  parameters:
    approximateFallback: true
    speculativeHold: 30s
    kvEventsConfig:
      topicFilter: "kv@"
- type: prefill-cost-scorer
  parameters:
    prefixMatchInfoProducerName: precise-prefix-cache-producer
    prefillTokensPerSecond: 15928
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefill-cost-scorer
  - pluginRef: max-score-picker
"""
# GIE's built-in default (pkg/epp/config/loader/defaults.go).
GIE_DEFAULT_PLUGINS_YAML = """
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
- type: metrics-data-source
- type: core-metrics-extractor
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
    weight: 2
  - pluginRef: prefix-cache-scorer
    weight: 3
"""


class ConfigError(ValueError):
    """A config problem, naming the offending key (and line when known)."""


@dataclass(slots=True)
class StaticEndpointSpec:
    address: str
    port: int
    labels: dict[str, str] = field(default_factory=dict)
    name: str | None = None
    metrics_port: int | None = None


@dataclass(slots=True)
class PluginSpec:
    name: str
    type: str
    parameters: dict[str, Any]
    line: int = 0
    type_line: int = 0  # the line of its `type:` (0: unknown; then `line`)


@dataclass(slots=True)
class ProfilePluginRef:
    ref: str
    weight: float | None
    line: int = 0


@dataclass(slots=True)
class ProfileSpec:
    name: str
    plugins: list[ProfilePluginRef]
    line: int = 0


@dataclass(slots=True)
class DataSourceSpec:
    ref: str
    extractors: list[str]
    line: int = 0


@dataclass
class EppConfig:
    raw: dict[str, Any]
    endpoints: list[StaticEndpointSpec] = field(default_factory=list)
    # incoming model name -> target model name (applied unless the rewrite header is set)
    model_rewrites: dict[str, str] = field(default_factory=dict)
    source: str = "<text>"
    api_version: str = ""
    kind: str = ""
    plugins: list[PluginSpec] = field(default_factory=list)
    profiles: list[ProfileSpec] = field(default_factory=list)
    saturation_detector: str | None = None
    feature_gates: list[str] = field(default_factory=list)
    data_sources: list[DataSourceSpec] = field(default_factory=list)
    # dataLayer.crossReplicaSyncerPluginRef / crossReplicaSyncInterval (seconds; None: the syncer's default)
    cross_replica_syncer: str | None = None
    cross_replica_interval: float | None = None
    flow_control: FlowControlSpec | None = None
    parser: str | None = None
    # requestHandler.parsers (or the deprecated top-level `parser`), in order: the request parsers to use.
    request_parsers: list[str] = field(default_factory=list)
    gate_values: dict[str, bool] = field(default_factory=dict)
    # dataLayer: injectDefaults (None = unset: inject the default metrics source), discovery/peerDiscovery refs.
    inject_data_defaults: bool | None = None
    discovery_ref: str | None = None
    peer_discovery_ref: str | None = None
    objectives: dict[str, int] = field(default_factory=dict)
    refresh_metrics_interval: float = 0.05
    metrics_staleness_threshold: float = 2.0
    refresh_prometheus_metrics_interval: float = 5.0
    pool_name: str = "default"
    # True when the file had no plugins and GIE's built-in default plugin set was used.
    default_plugins: bool = False
    warnings: list[str] = field(default_factory=list)

    def share_state_through(self, address: str) -> str:
        """Share in-flight load and speculative prefix entries with the other replicas through the Redis/Valkey at
        `address` (`--cross-replica-address`): a redis-cross-replica-syncer is added with that address alone, unless
        the file names its own syncer (`dataLayer.crossReplicaSyncerPluginRef`), which is kept. Returns the syncer's
        name."""
        return self._add_syncer("redis-cross-replica-syncer", {"address": address})

    def share_with_workers(self, socket_path: str) -> str:
        """`epp serve --workers N`: the workers share the same state through the parent's relay (a
        worker-state-syncer), unless the config names a syncer, through which each worker shares as a replica."""
        return self._add_syncer("worker-state-syncer", {"socket": socket_path})

    def _add_syncer(self, type_name: str, params: dict[str, Any]) -> str:
        if self.cross_replica_syncer is not None:
            return self.cross_replica_syncer
        taken = {p.name for p in self.plugins}
        name = next(
            n for n in ("cross-replica-syncer", *(f"cross-replica-syncer-{i}" for i in range(1, 99))) if n not in taken
        )
        self.plugins.append(PluginSpec(name, type_name, params))
        self.cross_replica_syncer = name
        return name

    def gate(self, name: str) -> bool:
        if name in self.gate_values:
            return self.gate_values[name]
        return name in self.feature_gates or FEATURE_GATE_DEFAULTS.get(name, False)

    def plugin(self, name: str) -> PluginSpec | None:
        return next((p for p in self.plugins if p.name == name), None)


class _Ctx:
    """Formats errors as `<source>:<line>: <key path>: <message>`."""

    def __init__(self, source: str) -> None:
        self.source = source

    def err(self, container: Any, key: str | int, path: str, message: str) -> ConfigError:
        line = line_of(container, key)
        where = f"{self.source}:{line}" if line else self.source
        return ConfigError(f"{where}: {path}: {message}")


def _mapping(
    ctx: _Ctx, parent: Any, key: str | int, path: str, value: Any, allowed: tuple[str, ...]
) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ctx.err(parent, key, path, f"expected a mapping, got {_kind(value)}")
    for k in value:
        if k not in allowed:
            raise ctx.err(value, k, f"{path}.{k}", f"unknown field (allowed: {', '.join(allowed)})")
    return value


def _list(ctx: _Ctx, parent: Any, key: str | int, path: str, value: Any) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ctx.err(parent, key, path, f"expected a list, got {_kind(value)}")
    return value


def _str(ctx: _Ctx, parent: Any, key: str, path: str, required: bool = True) -> str | None:
    v = parent.get(key) if isinstance(parent, Mapping) else None
    if v is None:
        if required:
            raise ctx.err(parent, key, f"{path}.{key}", "required")
        return None
    if not isinstance(v, str) or not v:
        raise ctx.err(parent, key, f"{path}.{key}", f"expected a non-empty string, got {v!r}")
    return v


def _kind(value: Any) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return "a string"
    return type(value).__name__


def parse_quantity(value: Any) -> int:
    """An integer or a Kubernetes quantity string ("1G", "512Mi") → int."""
    if isinstance(value, bool):
        raise ValueError(f"expected a size, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if not isinstance(value, str):
        raise ValueError(f"expected a size like 1000000 or '1Gi', got {value!r}")
    suffixes = {
        "Ki": 1 << 10,
        "Mi": 1 << 20,
        "Gi": 1 << 30,
        "Ti": 1 << 40,
        "k": 10**3,
        "K": 10**3,
        "M": 10**6,
        "G": 10**9,
        "T": 10**12,
    }
    s = value.strip()
    for suf, mult in sorted(suffixes.items(), key=lambda kv: -len(kv[0])):
        if s.endswith(suf):
            num = s[: -len(suf)]
            try:
                return int(float(num) * mult)
            except ValueError:
                break
    try:
        return int(s)
    except ValueError:
        raise ValueError(f"expected a size like 1000000 or '1Gi', got {value!r}") from None


def _endpoint(i: int, item: Any, ctx: _Ctx | None = None, parent: Any = None) -> StaticEndpointSpec:
    where = f"endpoints[{i}]"
    ctx = ctx or _Ctx("<config>")

    def fail(key: str | None, msg: str) -> ConfigError:
        if key is None or not isinstance(item, Mapping):
            return ctx.err(parent, i, where, msg)
        return ctx.err(item, key, f"{where}.{key}", msg)

    if not isinstance(item, dict):
        raise fail(None, "expected a mapping with address and port")
    for k in ("address", "port"):
        if k not in item:
            raise ctx.err(parent, i, f"{where}.{k}", "required")
    address = str(item["address"])
    try:
        if isinstance(item["port"], bool):
            raise TypeError
        port = int(item["port"])
    except (TypeError, ValueError):
        raise fail("port", f"must be an integer, got {item.get('port')!r}") from None
    if not 0 < port < 65536:
        raise fail("port", f"{port} is out of range")
    labels = item.get("labels") or {}
    if not isinstance(labels, dict):
        raise fail("labels", "expected a mapping")
    mp = item.get("metricsPort")
    try:
        metrics_port = int(mp) if mp is not None else None
    except (TypeError, ValueError):
        raise fail("metricsPort", f"must be an integer, got {mp!r}") from None
    return StaticEndpointSpec(
        address=address,
        port=port,
        labels={str(k): str(v) for k, v in labels.items()},
        name=item.get("name"),
        metrics_port=metrics_port,
    )


def _plugins(ctx: _Ctx, raw: Mapping[str, Any]) -> list[PluginSpec]:
    items = _list(ctx, raw, "plugins", "plugins", raw.get("plugins"))
    out: list[PluginSpec] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(items):
        path = f"plugins[{i}]"
        m = _mapping(ctx, items, i, path, item, ("name", "type", "parameters"))
        type_ = _str(ctx, m, "type", path)
        assert type_ is not None
        name = _str(ctx, m, "name", path, required=False) or type_
        params = m.get("parameters")
        if params is None:
            params = {}
        elif not isinstance(params, dict):
            raise ctx.err(m, "parameters", f"{path}.parameters", f"expected a mapping, got {_kind(params)}")
        if name in seen:
            raise ctx.err(m, "name" if "name" in m else "type", f"{path}.name", f"duplicate plugin name {name!r}")
        seen[name] = i
        # the parameters keep their line marks (MarkedDict) for the builder's error messages
        out.append(
            PluginSpec(name=name, type=type_, parameters=params, line=line_of(items, i), type_line=line_of(m, "type"))
        )
    return out


def _profiles(ctx: _Ctx, raw: Mapping[str, Any], names: set[str]) -> list[ProfileSpec]:
    items = _list(ctx, raw, "schedulingProfiles", "schedulingProfiles", raw.get("schedulingProfiles"))
    out: list[ProfileSpec] = []
    seen: set[str] = set()
    for i, item in enumerate(items):
        path = f"schedulingProfiles[{i}]"
        m = _mapping(ctx, items, i, path, item, ("name", "plugins"))
        pname = _str(ctx, m, "name", path)
        assert pname is not None
        if pname in seen:
            raise ctx.err(m, "name", f"{path}.name", f"duplicate profile name {pname!r}")
        seen.add(pname)
        refs = _list(ctx, m, "plugins", f"{path}.plugins", m.get("plugins"))
        prefs: list[ProfilePluginRef] = []
        for j, ref in enumerate(refs):
            rpath = f"{path}.plugins[{j}]"
            r = _mapping(ctx, refs, j, rpath, ref, ("pluginRef", "weight"))
            name = _str(ctx, r, "pluginRef", rpath)
            assert name is not None
            if name not in names:
                raise ctx.err(r, "pluginRef", f"{rpath}.pluginRef", f"no plugin named {name!r} in plugins")
            w = r.get("weight")
            if w is not None and (isinstance(w, bool) or not isinstance(w, int | float)):
                raise ctx.err(r, "weight", f"{rpath}.weight", f"expected a number, got {w!r}")
            if w is not None and w < 0:
                raise ctx.err(r, "weight", f"{rpath}.weight", f"must not be negative, got {w!r}")
            prefs.append(ProfilePluginRef(ref=name, weight=None if w is None else float(w), line=line_of(refs, j)))
        out.append(ProfileSpec(name=pname, plugins=prefs, line=line_of(items, i)))
    return out


def _ref(ctx: _Ctx, raw: Mapping[str, Any], key: str, names: set[str], path: str = "") -> str | None:
    v = raw.get(key)
    if v is None:
        return None
    path = path or key
    m = _mapping(ctx, raw, key, path, v, ("pluginRef",))
    ref = _str(ctx, m, "pluginRef", path)
    assert ref is not None
    if ref not in names:
        raise ctx.err(m, "pluginRef", f"{path}.pluginRef", f"no plugin named {ref!r} in plugins")
    return ref


def _request_parsers(ctx: _Ctx, raw: Mapping[str, Any], names: set[str]) -> list[str]:
    """`requestHandler.parsers` (llm-d-router), else the deprecated top-level `parser` (GIE): parser names."""
    v = raw.get("requestHandler")
    if v is not None:
        m = _mapping(ctx, raw, "requestHandler", "requestHandler", v, ("parsers",))
        items = _list(ctx, m, "parsers", "requestHandler.parsers", m.get("parsers"))
        out: list[str] = []
        for i, item in enumerate(items):
            path = f"requestHandler.parsers[{i}]"
            pm = _mapping(ctx, items, i, path, item, ("pluginRef",))
            ref = _str(ctx, pm, "pluginRef", path)
            assert ref is not None
            if ref not in names:
                raise ctx.err(pm, "pluginRef", f"{path}.pluginRef", f"no plugin named {ref!r} in plugins")
            if ref in out:
                raise ctx.err(pm, "pluginRef", f"{path}.pluginRef", f"parser {ref!r} listed twice")
            out.append(ref)
        if out:
            if raw.get("parser") is not None:
                log.warning("%s: parser: deprecated and ignored, requestHandler.parsers is set", ctx.source)
            return out
    legacy = _ref(ctx, raw, "parser", names)
    if legacy is not None and raw.get("requestHandler") is None:
        log.info("%s: parser: deprecated, use requestHandler.parsers", ctx.source)
    return [legacy] if legacy is not None else []


def _feature_gates(ctx: _Ctx, raw: Mapping[str, Any]) -> dict[str, bool]:
    """`featureGates: [name, name=false, ...]` → {name: on}; unknown names and bad values are errors."""
    gates = _list(ctx, raw, "featureGates", "featureGates", raw.get("featureGates"))
    out: dict[str, bool] = {}
    for i, g in enumerate(gates):
        if not isinstance(g, str) or not g:
            raise ctx.err(gates, i, f"featureGates[{i}]", f"expected a gate name, got {g!r}")
        name, eq, value = g.partition("=")
        name = name.strip()
        if name not in FEATURE_GATE_DEFAULTS:
            known = ", ".join(FEATURE_GATES)
            raise ctx.err(gates, i, f"featureGates[{i}]", f"unknown feature gate {name!r} (known: {known})")
        on = True
        if eq:
            v = value.strip()
            parsed = _GO_BOOLS.get(v.lower()) if v in (v.lower(), v.upper(), v.capitalize()) else None
            if parsed is None:
                raise ctx.err(gates, i, f"featureGates[{i}]", f"{v!r} is not a valid value for the gate {name}")
            on = parsed
        out[name] = on
    return out


def _data_layer(
    ctx: _Ctx, raw: Mapping[str, Any], names: set[str], cfg: EppConfig | None = None
) -> list[DataSourceSpec]:
    key = "dataLayer" if "dataLayer" in raw else "data"
    v = raw.get(key)
    if v is None:
        return []
    allowed = (
        "sources",
        "injectDefaults",
        "discovery",
        "peerDiscovery",
        "crossReplicaSyncerPluginRef",
        "crossReplicaSyncInterval",
    )
    m = _mapping(ctx, raw, key, key, v, allowed)
    if cfg is not None:
        inject = m.get("injectDefaults")
        if inject is not None and not isinstance(inject, bool):
            raise ctx.err(m, "injectDefaults", f"{key}.injectDefaults", f"expected true or false, got {inject!r}")
        cfg.inject_data_defaults = inject
        cfg.discovery_ref = _discovery_ref(ctx, m, "discovery", key, names)
        cfg.peer_discovery_ref = _discovery_ref(ctx, m, "peerDiscovery", key, names)
    sources = _list(ctx, m, "sources", f"{key}.sources", m.get("sources"))
    out = []
    for i, s in enumerate(sources):
        path = f"{key}.sources[{i}]"
        sm = _mapping(ctx, sources, i, path, s, ("pluginRef", "extractors"))
        ref = _str(ctx, sm, "pluginRef", path)
        assert ref is not None
        if ref not in names:
            raise ctx.err(sm, "pluginRef", f"{path}.pluginRef", f"no plugin named {ref!r} in plugins")
        exs = _list(ctx, sm, "extractors", f"{path}.extractors", sm.get("extractors"))
        ex_refs = []
        for j, e in enumerate(exs):
            epath = f"{path}.extractors[{j}]"
            em = _mapping(ctx, exs, j, epath, e, ("pluginRef",))
            eref = _str(ctx, em, "pluginRef", epath)
            assert eref is not None
            if eref not in names:
                raise ctx.err(em, "pluginRef", f"{epath}.pluginRef", f"no plugin named {eref!r} in plugins")
            ex_refs.append(eref)
        out.append(DataSourceSpec(ref=ref, extractors=ex_refs, line=line_of(sources, i)))
    return out


def _cross_replica(ctx: _Ctx, raw: Mapping[str, Any], names: set[str]) -> tuple[str | None, float | None]:
    """llm-d's `dataLayer.crossReplicaSyncerPluginRef` (a plugin name) and `crossReplicaSyncInterval` (a duration)."""
    m = raw.get("dataLayer")
    if not isinstance(m, Mapping):
        return None, None
    ref = _str(ctx, m, "crossReplicaSyncerPluginRef", "dataLayer", required=False) or None
    path = "dataLayer.crossReplicaSyncerPluginRef"
    if ref is not None and ref not in names:
        raise ctx.err(m, "crossReplicaSyncerPluginRef", path, f"no plugin named {ref!r} in plugins")
    interval = None
    if m.get("crossReplicaSyncInterval") is not None:
        try:
            interval = parse_duration(m["crossReplicaSyncInterval"])
        except ValueError as e:
            raise ctx.err(m, "crossReplicaSyncInterval", "dataLayer.crossReplicaSyncInterval", str(e)) from None
        if interval <= 0:
            raise ctx.err(
                m, "crossReplicaSyncInterval", "dataLayer.crossReplicaSyncInterval", f"must be positive, got {interval}"
            )
    return ref, interval


def _discovery_ref(ctx: _Ctx, m: Mapping[str, Any], key: str, parent: str, names: set[str]) -> str | None:
    """`dataLayer.discovery` / `peerDiscovery`: {pluginRef} (llm-d-router); llm-d's guides also nest it under
    `endpoints:`, which the hub types use."""
    v = m.get(key)
    if v is None:
        return None
    path = f"{parent}.{key}"
    d = _mapping(ctx, m, key, path, v, ("pluginRef", "endpoints"))
    if "endpoints" in d:
        d = _mapping(ctx, d, "endpoints", f"{path}.endpoints", d["endpoints"], ("pluginRef",))
        path = f"{path}.endpoints"
    ref = _str(ctx, d, "pluginRef", path)
    assert ref is not None
    if ref not in names:
        raise ctx.err(d, "pluginRef", f"{path}.pluginRef", f"no plugin named {ref!r} in plugins")
    return ref


_BAND_KEYS = ("priority", "priorityName", "maxBytes", "maxRequests", "fairnessPolicyRef", "orderingPolicyRef")


def _band(
    ctx: _Ctx,
    parent: Any,
    key: str | int,
    path: str,
    v: Any,
    default_priority: int | None,
    names: set[str] | None = None,
) -> PriorityBandSpec:
    m = _mapping(ctx, parent, key, path, v, _BAND_KEYS)
    prio = m.get("priority", default_priority)
    if isinstance(prio, bool) or not isinstance(prio, int):
        raise ctx.err(m, "priority", f"{path}.priority", f"expected an integer, got {prio!r}")
    band = PriorityBandSpec(priority=prio, name=str(m.get("priorityName") or ""))
    if m.get("maxBytes") is not None:
        band.max_bytes = _size(ctx, m, "maxBytes", f"{path}.maxBytes")
    if m.get("maxRequests") is not None:
        band.max_requests = _size(ctx, m, "maxRequests", f"{path}.maxRequests")
    band.fairness_policy_ref = _check_ref(ctx, m, "fairnessPolicyRef", path, names)
    band.ordering_policy_ref = _check_ref(ctx, m, "orderingPolicyRef", path, names)
    return band


def _size(ctx: _Ctx, m: Mapping[str, Any], key: str, path: str) -> int:
    try:
        n = parse_quantity(m[key])
    except ValueError as e:
        raise ctx.err(m, key, path, str(e)) from None
    if n < 0:
        raise ctx.err(m, key, path, f"must not be negative, got {m[key]!r}")
    return n


def _check_ref(ctx: _Ctx, m: Mapping[str, Any], key: str, path: str, names: set[str] | None) -> str | None:
    v = m.get(key)
    if v is None:
        return None
    if not isinstance(v, str) or not v:
        raise ctx.err(m, key, f"{path}.{key}", f"expected a plugin name, got {v!r}")
    if names is not None and v not in names:
        raise ctx.err(m, key, f"{path}.{key}", f"no plugin named {v!r} in plugins")
    return v


def _flow_control(ctx: _Ctx, raw: Mapping[str, Any], names: set[str] | None = None) -> FlowControlSpec | None:
    v = raw.get("flowControl")
    if v is None:
        return None
    keys = (
        "maxBytes",
        "maxRequests",
        "defaultRequestTTL",
        "defaultPriorityBand",
        "priorityBands",
        "usageLimitPolicyPluginRef",
        "noEndpointRequestTTL",
        "defaultNegativePriorityBand",
        "saturationDetector",
        "enableEviction",
    )
    m = _mapping(ctx, raw, "flowControl", "flowControl", v, keys)
    fc = FlowControlSpec()
    if m.get("maxBytes") is not None:
        fc.max_bytes = _size(ctx, m, "maxBytes", "flowControl.maxBytes")
    if m.get("maxRequests") is not None:
        fc.max_requests = _size(ctx, m, "maxRequests", "flowControl.maxRequests")
    if m.get("defaultRequestTTL") is not None:
        try:
            fc.default_request_ttl = parse_duration(m["defaultRequestTTL"])
        except ValueError as e:
            raise ctx.err(m, "defaultRequestTTL", "flowControl.defaultRequestTTL", str(e)) from None
    if m.get("defaultPriorityBand") is not None:
        fc.default_priority_band = _band(
            ctx, m, "defaultPriorityBand", "flowControl.defaultPriorityBand", m["defaultPriorityBand"], 0, names
        )
    bands = _list(ctx, m, "priorityBands", "flowControl.priorityBands", m.get("priorityBands"))
    seen: set[int] = set()
    for i, b in enumerate(bands):
        path = f"flowControl.priorityBands[{i}]"
        band = _band(ctx, bands, i, path, b, None, names)
        if band.priority in seen:
            raise ctx.err(bands, i, f"{path}.priority", f"duplicate priority {band.priority}")
        seen.add(band.priority)
        fc.priority_bands.append(band)
    fc.usage_limit_policy_ref = _check_ref(ctx, m, "usageLimitPolicyPluginRef", "flowControl", names)
    if m.get("noEndpointRequestTTL") is not None:
        try:
            fc.no_endpoint_request_ttl = parse_duration(m["noEndpointRequestTTL"])
        except ValueError as e:
            raise ctx.err(m, "noEndpointRequestTTL", "flowControl.noEndpointRequestTTL", str(e)) from None
    if m.get("defaultNegativePriorityBand") is not None:
        fc.default_negative_priority_band = _band(
            ctx,
            m,
            "defaultNegativePriorityBand",
            "flowControl.defaultNegativePriorityBand",
            m["defaultNegativePriorityBand"],
            -1,
            names,
        )
    ev = m.get("enableEviction")
    if ev is not None and not isinstance(ev, bool):
        raise ctx.err(m, "enableEviction", "flowControl.enableEviction", f"expected true or false, got {ev!r}")
    fc.enable_eviction = bool(ev)
    if names is not None:
        fc.saturation_detector_ref = _ref(ctx, m, "saturationDetector", names, "flowControl.saturationDetector")
    return fc


def _objectives(ctx: _Ctx, raw: Mapping[str, Any]) -> dict[str, int]:
    items = _list(ctx, raw, "objectives", "objectives", raw.get("objectives"))
    out: dict[str, int] = {}
    for i, item in enumerate(items):
        path = f"objectives[{i}]"
        m = _mapping(ctx, items, i, path, item, ("name", "priority"))
        name = _str(ctx, m, "name", path)
        assert name is not None
        prio = m.get("priority", 0)
        if isinstance(prio, bool) or not isinstance(prio, int):
            raise ctx.err(m, "priority", f"{path}.priority", f"expected an integer, got {prio!r}")
        if name in out:
            raise ctx.err(m, "name", f"{path}.name", f"duplicate objective {name!r}")
        out[name] = prio
    return out


def _duration_key(ctx: _Ctx, raw: Mapping[str, Any], key: str, default: float, positive: bool = True) -> float:
    if raw.get(key) is None:
        return default
    try:
        d = parse_duration(raw[key])
    except ValueError as e:
        raise ctx.err(raw, key, key, str(e)) from None
    if positive and d <= 0:
        raise ctx.err(raw, key, key, f"must be positive, got {raw[key]!r}")
    return d


def parse_config(text: str, source: str = "<text>", *, allow_empty: bool = True) -> EppConfig:
    """The config in `text`; an empty one is the default config unless `allow_empty` is false (a file)."""
    ctx = _Ctx(source)
    try:
        raw = load_marked(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        what = "" if isinstance(e, yaml.constructor.ConstructorError) else "invalid YAML: "
        raise ConfigError(f"{where}: {what}{getattr(e, 'problem', None) or e}") from None
    if raw is None:
        if not allow_empty:
            raise ConfigError(f"{source}:1: the config is empty (no EndpointPickerConfig in it)")
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: top level must be a mapping")
    warnings: list[str] = []
    for k in raw:  # the anchors decode strictly: an unknown top-level key is an error
        if k not in GIE_KEYS and k not in EXTENSION_KEYS:
            allowed = ", ".join((*GIE_KEYS, *EXTENSION_KEYS))
            raise ctx.err(raw, k, str(k), f"unknown top-level key (allowed: {allowed})")
    api_version = raw.get("apiVersion")
    if api_version is not None and api_version not in API_VERSIONS:
        supported = ", ".join(API_VERSIONS)
        raise ctx.err(raw, "apiVersion", "apiVersion", f"unsupported {api_version!r} (supported: {supported})")
    kind = raw.get("kind")
    if kind is not None and kind != KIND:
        raise ctx.err(raw, "kind", "kind", f"expected {KIND}, got {kind!r}")

    gate_values = _feature_gates(ctx, raw)

    eps = _list(ctx, raw, "endpoints", "endpoints", raw.get("endpoints"))
    rewrites = raw.get("modelRewrites") or {}
    if not isinstance(rewrites, dict):
        raise ctx.err(raw, "modelRewrites", "modelRewrites", "expected a mapping of model -> target")

    default_plugins = not raw.get("plugins") and not raw.get("schedulingProfiles")
    plugin_src: Mapping[str, Any] = load_marked(DEFAULT_PLUGINS_YAML) if default_plugins else raw
    plugins = _plugins(ctx if not default_plugins else _Ctx("<default config>"), plugin_src)
    names = {p.name for p in plugins}
    profiles = _profiles(ctx if not default_plugins else _Ctx("<default config>"), plugin_src, names)
    holder = EppConfig(raw={})
    data_sources = _data_layer(ctx, raw, names, holder)
    cross_replica_syncer, cross_replica_interval = _cross_replica(ctx, raw, names)
    flow_control = _flow_control(ctx, raw, names)
    detector = _ref(ctx, raw, "saturationDetector", names)
    if detector is not None:
        warnings.append(
            f"{source}:{line_of(raw, 'saturationDetector')}: saturationDetector: deprecated, "
            "use flowControl.saturationDetector"
        )
    if flow_control is not None and flow_control.saturation_detector_ref is not None:
        detector = flow_control.saturation_detector_ref  # the new field wins, as in llm-d-router

    cfg = EppConfig(
        raw=raw,
        endpoints=[_endpoint(i, e, ctx, eps) for i, e in enumerate(eps)],
        model_rewrites={str(k): str(v) for k, v in rewrites.items()},
        source=source,
        api_version=api_version or "",
        kind=kind or "",
        plugins=plugins,
        profiles=profiles,
        saturation_detector=detector,
        feature_gates=[g for g, on in gate_values.items() if on],
        gate_values=gate_values,
        data_sources=data_sources,
        cross_replica_syncer=cross_replica_syncer,
        cross_replica_interval=cross_replica_interval,
        flow_control=flow_control,
        parser=_ref(ctx, raw, "parser", names),
        request_parsers=_request_parsers(ctx, raw, names),
        inject_data_defaults=holder.inject_data_defaults,
        discovery_ref=holder.discovery_ref,
        peer_discovery_ref=holder.peer_discovery_ref,
        objectives=_objectives(ctx, raw),
        refresh_metrics_interval=_duration_key(ctx, raw, "refreshMetricsInterval", 0.05),
        metrics_staleness_threshold=_duration_key(ctx, raw, "metricsStalenessThreshold", 2.0),
        refresh_prometheus_metrics_interval=_duration_key(ctx, raw, "refreshPrometheusMetricsInterval", 5.0),
        pool_name=str(raw.get("poolName") or "default"),
        default_plugins=default_plugins,
        warnings=warnings,
    )
    for w in warnings:
        log.warning("%s", w)
    return cfg


def load_config(path: str | Path) -> EppConfig:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ConfigError(f"{p}: cannot read config: {e.strerror}") from None
    return parse_config(text, source=str(p), allow_empty=False)
