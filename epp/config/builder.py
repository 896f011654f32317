"""Build the plugin pipeline from an EppConfig: instantiate plugins, apply GIE's defaults, assemble profiles.

Errors are ConfigErrors naming the plugin, the parameter key and its line in the file.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import epp.datalayer.plugins
import epp.requestcontrol.flowcontrol_plugins  # noqa: F401  (registers the flow-control policy types)
from epp.config.loader import ConfigError, EppConfig, PluginSpec
from epp.config.yamlmarks import line_of
from epp.framework import (
    DataProducer,
    Filter,
    Picker,
    Plugin,
    PluginConfigError,
    PluginContext,
    PreRequest,
    ProfileHandler,
    ResponseComplete,
    ResponseReceived,
    SaturationDetector,
    Scorer,
    get_factory,
    known_types,
)
from epp.framework.registry import Factory
from epp.scheduling import Scheduler, SchedulerProfile, WeightedScorer

log = logging.getLogger(__name__)

# Request parsers belong to the protocol layer; if it has not registered these types, accept them as markers.
PARSER_TYPES = ("openai-parser", "passthrough-parser", "vllmgrpc-parser")


class ParserMarker(Plugin):
    """Stands for a parser the protocol layer implements (the config only selects it)."""

    @classmethod
    def from_config(cls, name: str, parameters: dict[str, Any], context: Any) -> ParserMarker:
        return cls(name)


@dataclass
class Pipeline:
    """Everything request control needs, built from the config."""

    plugins: dict[str, Any]
    scheduler: Scheduler
    saturation_detector: SaturationDetector
    producers: list[DataProducer] = field(default_factory=list)
    pre_request: list[PreRequest] = field(default_factory=list)
    response_received: list[ResponseReceived] = field(default_factory=list)
    response_complete: list[ResponseComplete] = field(default_factory=list)


def _factory(spec: PluginSpec) -> Factory | None:
    f = get_factory(spec.type)
    if f is None and spec.type in PARSER_TYPES:
        return ParserMarker.from_config
    return f


def _instantiate(config: EppConfig, spec: PluginSpec, context: PluginContext, where: str) -> Any:
    src = config.source if not config.default_plugins else "<default config>"
    loc = f"{src}:{spec.line}" if spec.line else src
    factory = _factory(spec)
    if factory is None:
        raise ConfigError(f"{loc}: {where}.type: unknown plugin type {spec.type!r} (known: {', '.join(known_types())})")
    try:
        plugin = factory(spec.name, spec.parameters, context)
    except PluginConfigError as e:
        pline = line_of(spec.parameters, e.key) if e.key else 0
        ploc = f"{src}:{pline}" if pline else loc
        key = f"{where}.parameters.{e.key}" if e.key else f"{where}.parameters"
        raise ConfigError(f"{ploc}: {key}: {e}") from None
    except (ValueError, TypeError, KeyError) as e:
        raise ConfigError(f"{loc}: {where} ({spec.type}): {e}") from None
    if getattr(plugin, "name", None) != spec.name:
        plugin.name = spec.name
    if not getattr(plugin, "type_name", ""):
        plugin.type_name = spec.type
    return plugin


def build_pipeline(config: EppConfig, context: PluginContext) -> Pipeline:
    plugins: dict[str, Any] = {}
    for i, spec in enumerate(config.plugins):
        plugins[spec.name] = _instantiate(config, spec, context, f"plugins[{i}]")
    # Helper plugins asked for by others (e.g. prefix-cache-scorer → approx-prefix-cache-producer).
    done = 0
    while done < len(context.requirements):
        req = context.requirements[done]
        done += 1
        if req.name not in plugins:
            spec = PluginSpec(name=req.name, type=req.type, parameters=req.parameters)
            plugins[req.name] = _instantiate(config, spec, context, f"(auto-added {req.type})")

    profiles = _profiles(config, plugins)
    handlers = [p for p in plugins.values() if isinstance(p, ProfileHandler)]
    if len(handlers) > 1:
        names = ", ".join(h.name for h in handlers)
        raise ConfigError(f"{config.source}: plugins: more than one profile handler ({names})")
    if handlers:
        handler = handlers[0]
    elif len(profiles) == 1:
        handler = get_factory("single-profile-handler")("single-profile-handler", {}, context)  # type: ignore[misc]
    else:
        raise ConfigError(
            f"{config.source}: schedulingProfiles: {len(profiles)} profiles need a profile handler plugin "
            "(single-profile-handler runs exactly one)"
        )
    max_profiles = getattr(handler, "max_profiles", None)
    if max_profiles is not None and len(profiles) > max_profiles:
        raise ConfigError(
            f"{config.source}: schedulingProfiles: {handler.name} supports {max_profiles} profile, got {len(profiles)}"
        )

    detector = _saturation_detector(config, plugins, context)
    everything = list(plugins.values())
    return Pipeline(
        plugins=plugins,
        scheduler=Scheduler(profiles, handler),
        saturation_detector=detector,
        producers=[p for p in everything if isinstance(p, DataProducer)],
        pre_request=[p for p in everything if isinstance(p, PreRequest)],
        response_received=[p for p in everything if isinstance(p, ResponseReceived)],
        response_complete=[p for p in everything if isinstance(p, ResponseComplete)],
    )


def _profiles(config: EppConfig, plugins: dict[str, Any]) -> dict[str, SchedulerProfile]:
    out: dict[str, SchedulerProfile] = {}
    if not config.profiles:
        # GIE default: one profile named "default" with every Filter, Scorer and Picker plugin (weight 1).
        members: list[tuple[str, float | None, int]] = [(n, None, 0) for n, p in plugins.items() if _is_member(p)]
        out["default"] = _profile(config, "default", members, plugins)
        return out
    for i, prof in enumerate(config.profiles):
        members = [(r.ref, r.weight, r.line) for r in prof.plugins]
        out[prof.name] = _profile(config, prof.name, members, plugins, f"schedulingProfiles[{i}]")
    return out


def _is_member(p: Any) -> bool:
    return isinstance(p, Filter | Scorer | Picker) and not isinstance(p, ProfileHandler)


def _profile(
    config: EppConfig,
    name: str,
    members: Sequence[tuple[str, float | None, int]],
    plugins: dict[str, Any],
    where: str = "schedulingProfiles",
) -> SchedulerProfile:
    filters: list[Filter] = []
    scorers: list[WeightedScorer] = []
    picker: Picker | None = None
    for j, (ref, weight, line) in enumerate(members):
        p = plugins[ref]
        loc = f"{config.source}:{line}" if line else config.source
        used = False
        if isinstance(p, Filter):
            filters.append(p)
            used = True
        if isinstance(p, Scorer):
            scorers.append(WeightedScorer(p, 1.0 if weight is None else weight))
            used = True
        if isinstance(p, Picker):
            if picker is not None:
                raise ConfigError(f"{loc}: {where}.plugins[{j}]: profile {name!r} has a second picker {ref!r}")
            picker = p
            used = True
        if not used:
            raise ConfigError(
                f"{loc}: {where}.plugins[{j}].pluginRef: {ref!r} is not a filter, scorer or picker "
                f"(type {getattr(p, 'type_name', '?')})"
            )
    if picker is None:
        picker = get_factory("max-score-picker")("max-score-picker", {}, None)  # type: ignore[misc]
    assert picker is not None
    return SchedulerProfile(name, filters, scorers, picker)


def _saturation_detector(config: EppConfig, plugins: dict[str, Any], context: PluginContext) -> SaturationDetector:
    if config.saturation_detector is not None:
        p = plugins[config.saturation_detector]
        if not isinstance(p, SaturationDetector):
            raise ConfigError(
                f"{config.source}:{line_of(config.raw.get('saturationDetector'), 'pluginRef')}: "
                f"saturationDetector.pluginRef: {p.name!r} is not a saturation detector"
            )
        return p
    configured = [p for p in plugins.values() if getattr(p, "type_name", "") == "utilization-detector"]
    if len(configured) == 1:
        detector: SaturationDetector = configured[0]
        return detector
    factory = get_factory("utilization-detector")
    assert factory is not None
    detector = factory("utilization-detector", {}, context)
    return detector
