"""Build the plugin pipeline from an EppConfig: instantiate plugins, add the producers they need, order the
producers by their data dependencies, apply GIE's defaults and assemble the profiles.

Errors are ConfigErrors naming the plugin, the parameter key and its line in the file.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from epp.config.loader import ConfigError, EppConfig, PluginSpec
from epp.config.yamlmarks import line_of
from epp.framework import (
    Admitter,
    CrossReplicaContributor,
    CrossReplicaMessageCarrier,
    CrossReplicaMessenger,
    CrossReplicaSyncer,
    DataKey,
    DataProducer,
    ExtractorHost,
    Filter,
    Params,
    Picker,
    Plugin,
    PluginConfigError,
    PluginContext,
    PluginRegistry,
    PreRequest,
    ProfileHandler,
    ReferencesPlugins,
    RequestHeaderProcessor,
    ResponseComplete,
    ResponseReceived,
    ResponseStreaming,
    SaturationDetector,
    Scorer,
    Screener,
)
from epp.framework.parsing import ParserRegistry, RequestParser
from epp.requestcontrol.pipeline import Pipeline
from epp.scheduling import Scheduler, SchedulerProfile, WeightedScorer
from epp.wiring.builtins import DEFAULT_PARSERS, register_builtins

log = logging.getLogger(__name__)

# Types the anchors renamed and no longer register (a config naming one is refused, as by them): the new name.
RENAMED = {"kv-cache-scorer": "kv-cache-utilization-scorer"}


@dataclass(slots=True)
class _Built:
    plugin: Plugin
    where: str  # "<file>:<line>: plugins[i]" (an added producer: the plugin that asked for it)
    path: str  # "plugins[i]"
    line: int


class _Builder:
    def __init__(self, config: EppConfig, context: PluginContext, registry: PluginRegistry) -> None:
        self.config = config
        self.context = context
        self.registry = registry
        self.src = config.source if not config.default_plugins else "<default config>"
        self.built: dict[str, _Built] = {}
        self.settled: set[int] = set()  # requirements already met (add_required_producers runs twice)

    def loc(self, line: int) -> str:
        return f"{self.src}:{line}" if line else self.src

    def instantiate(self, spec: PluginSpec, where: str, *, record: bool = True, note: str = "") -> Plugin:
        """Build one plugin; `where` is its config path for errors, `note` says why an unlisted one exists."""
        loc = self.loc(spec.line)
        factory = self.registry.factory(spec.type)
        if factory is None:
            known = self.registry.known_types()
            close = [RENAMED[spec.type]] if spec.type in RENAMED else difflib.get_close_matches(spec.type, known, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ConfigError(
                f"{self.loc(spec.type_line or spec.line)}: {where}.type: unknown plugin type {spec.type!r} "
                f"({hint}known: {', '.join(known)})"
            )
        params = Params(spec.name, spec.parameters)
        try:
            plugin = factory(spec.name, params, self.context)
            unknown = params.unread_error()
            if unknown is not None:  # the anchors decode parameters strictly: an unknown one is an error
                raise unknown
        except PluginConfigError as e:
            pline = e.line or (line_of(spec.parameters, e.key.split(".")[0]) if e.key else 0)
            key = f"{where}.parameters.{e.key}" if e.key else f"{where}.parameters"
            raise ConfigError(f"{self.loc(pline) if pline else loc}: {key}: {e}{note}") from None
        except (ValueError, TypeError, KeyError) as e:
            raise ConfigError(f"{loc}: {where} ({spec.type}): {e}{note}") from None
        except Exception as e:  # a third-party factory's own failure still names the plugin and the line
            log.exception("plugin factory for %s failed", spec.type)
            raise ConfigError(f"{loc}: {where} ({spec.type}): {type(e).__name__}: {e}{note}") from None
        if not isinstance(plugin, Plugin):
            raise ConfigError(
                f"{loc}: {where} ({spec.type}): the factory returned {type(plugin).__name__}, not a Plugin"
            )
        if plugin.name != spec.name:
            plugin.name = spec.name
        if record:
            self.built[spec.name] = _Built(plugin, f"{loc}: {where}", where, spec.line)
        return plugin

    def producers_of(self, key: DataKey[object]) -> list[Plugin]:
        return [b.plugin for b in self.built.values() if key in b.plugin.produces()]

    def add_required_producers(self) -> None:
        """Producers other plugins asked for, unless a configured plugin already produces the key."""
        reqs = self.context.requirements
        done = 0
        while done < len(reqs):  # an added producer may require another
            req = reqs[done]
            done += 1
            if id(req) in self.settled:
                continue
            self.settled.add(id(req))
            producers = self.producers_of(req.key)
            if producers:
                asker = self.built.get(req.requested_by)
                if req.source and asker is not None:
                    by = producers[0]
                    log.warning(
                        "%s (%s).parameters.%s is not used: %s %r (%s) produces %s; this plugin reads that",
                        asker.where,
                        asker.plugin.type_name,
                        req.source,
                        by.type_name,
                        by.name,
                        self.built[by.name].path,
                        req.key.name,
                    )
                continue
            who = req.requested_by or "a plugin"
            existing = self.built.get(req.name)
            if existing is not None:
                raise ConfigError(
                    f"{existing.where}: {who} needs {req.key.name} from a {req.type} named {req.name!r}, "
                    f"but the plugin of that name ({existing.plugin.type_name}) does not produce it"
                )
            asker = self.built.get(req.requested_by)
            spec = PluginSpec(name=req.name, type=req.type, parameters=req.parameters, line=asker.line if asker else 0)
            where = asker.path if asker else "plugins"
            self.instantiate(spec, where, note=f" (in the {req.type} added for {who})")

    def resolve_references(self) -> None:
        """Let plugins that name other plugins (a handler's deciders) find them, in any order in the file."""
        plugins = {name: b.plugin for name, b in self.built.items()}
        for b in list(self.built.values()):
            if not isinstance(b.plugin, ReferencesPlugins):
                continue
            try:
                b.plugin.resolve_plugins(plugins, self.context)
            except PluginConfigError as e:
                loc = self.loc(e.line or b.line)
                key = f"{b.path}.parameters.{e.key}" if e.key else f"{b.path}.parameters"
                raise ConfigError(f"{loc}: {key}: {e}") from None

    def check_consumers(self) -> None:
        for b in self.built.values():
            for key in b.plugin.consumes():
                if not self.producers_of(key):
                    raise ConfigError(
                        f"{b.where}: {b.plugin.type_name} {b.plugin.name!r} needs {key.name}, which no configured "
                        f"plugin produces (configure its producer, or name the right one in the parameters)"
                    )

    def ordered_producers(self) -> list[DataProducer]:
        """DataProducers, each after the producers of the keys it consumes (else in config order)."""
        producers: list[Plugin] = [b.plugin for b in self.built.values() if isinstance(b.plugin, DataProducer)]
        deps: dict[str, set[str]] = {}
        for p in producers:
            wanted = set(p.consumes()) | set(p.uses())
            deps[p.name] = {q.name for q in producers if q is not p and wanted.intersection(q.produces())}
        order: list[DataProducer] = []
        placed: set[str] = set()
        while len(order) < len(producers):
            ready = next((p for p in producers if p.name not in placed and deps[p.name] <= placed), None)
            if ready is None:
                stuck = ", ".join(p.name for p in producers if p.name not in placed)
                raise ConfigError(f"{self.src}: plugins: data producers depend on each other in a cycle ({stuck})")
            assert isinstance(ready, DataProducer)
            order.append(ready)
            placed.add(ready.name)
        return order


def build_pipeline(config: EppConfig, context: PluginContext, registry: PluginRegistry | None = None) -> Pipeline:
    b = _Builder(config, context, registry or register_builtins())
    for i, spec in enumerate(config.plugins):
        b.instantiate(spec, f"plugins[{i}]")
    _wire_data_sources(b)
    b.add_required_producers()
    b.resolve_references()
    b.add_required_producers()  # references may ask for producers too (a decider's prefix producer)
    b.check_consumers()
    producers = b.ordered_producers()
    plugins = {name: built.plugin for name, built in b.built.items()}

    profiles = _profiles(b, plugins)
    handlers = [p for p in plugins.values() if isinstance(p, ProfileHandler)]
    if len(handlers) > 1:
        names = ", ".join(h.name for h in handlers)
        raise ConfigError(f"{config.source}: plugins: more than one profile handler ({names})")
    handler: ProfileHandler
    if handlers:
        handler = handlers[0]
    elif len(profiles) == 1:
        default = _default(b, "single-profile-handler")
        assert isinstance(default, ProfileHandler)
        handler = default
    else:
        raise ConfigError(
            f"{config.source}: schedulingProfiles: {len(profiles)} profiles need a profile handler plugin "
            "(single-profile-handler runs exactly one)"
        )
    max_profiles = handler.max_profiles
    if max_profiles is not None and len(profiles) > max_profiles:
        raise ConfigError(
            f"{config.source}: schedulingProfiles: {handler.name} supports {max_profiles} profile, got {len(profiles)}"
        )

    detector = _saturation_detector(b, plugins)
    _attach_cross_replica(b, plugins)
    parsers = _parsers(b, plugins)
    parser_registry = _parser_registry(b, plugins, parsers)
    everything = list(plugins.values())
    return Pipeline(
        plugins=plugins,
        scheduler=Scheduler(profiles, handler),
        saturation_detector=detector,
        producers=producers,
        pre_request=[p for p in everything if isinstance(p, PreRequest)],
        response_received=[p for p in everything if isinstance(p, ResponseReceived)],
        response_complete=[p for p in everything if isinstance(p, ResponseComplete)],
        admitters=[p for p in everything if isinstance(p, Admitter)],
        response_streaming=[p for p in everything if isinstance(p, ResponseStreaming)],
        parsers=parsers,
        parser_registry=parser_registry,
        header_processors=[p for p in everything if isinstance(p, RequestHeaderProcessor)],
        screeners=[p for p in everything if isinstance(p, Screener)],
    )


def _wire_data_sources(b: _Builder) -> None:
    """dataLayer.sources: hand each polling source (dcgm, models) the extractors listed under it."""
    for i, src in enumerate(b.config.data_sources):
        source = b.built[src.ref].plugin
        if not isinstance(source, ExtractorHost):
            continue
        try:
            source.attach_extractors([b.built[e].plugin for e in src.extractors])
        except ValueError as e:
            raise ConfigError(f"{b.loc(src.line)}: dataLayer.sources[{i}].extractors: {e}") from None


def _attach_cross_replica(b: _Builder, plugins: dict[str, Plugin]) -> None:
    """Hand the syncer named by dataLayer.crossReplicaSyncerPluginRef every contributor that shares its state."""
    config = b.config
    ref = config.cross_replica_syncer
    if ref is None:
        return
    syncer = plugins[ref]
    if not isinstance(syncer, CrossReplicaSyncer):
        raise ConfigError(
            f"{config.source}:{line_of(config.raw.get('dataLayer'), 'crossReplicaSyncerPluginRef')}: "
            f"dataLayer.crossReplicaSyncerPluginRef: {ref!r} is not a cross-replica syncer (type {syncer.type_name})"
        )
    contributors = [p for p in plugins.values() if isinstance(p, CrossReplicaContributor) and p.cross_replica_key()]
    syncer.attach(contributors, config.cross_replica_interval)
    if isinstance(syncer, CrossReplicaMessageCarrier):
        syncer.attach_messengers(
            [p for p in plugins.values() if isinstance(p, CrossReplicaMessenger) and p.cross_replica_channel()]
        )


def _parsers(b: _Builder, plugins: dict[str, Plugin]) -> list[Plugin]:
    """The request handler's parser chain (`requestHandler.parsers`), each a parser plugin."""
    out: list[Plugin] = []
    for ref in b.config.request_parsers:
        p = plugins[ref]
        if not isinstance(p, RequestParser):
            raise ConfigError(f"{b.src}: requestHandler.parsers: {ref!r} is not a parser (type {p.type_name})")
        out.append(p)
    return out


def _parser_registry(b: _Builder, plugins: dict[str, Plugin], parsers: list[Plugin]) -> ParserRegistry:
    """The router's resolution over the chain; none listed = its defaults (openai, anthropic, vllmhttp, then
    passthrough as the fallback), each the configured plugin of that name if there is one. An explicit list gains
    no fallback: a path no listed parser claims is refused."""
    chain = parsers or [plugins.get(t) or _default(b, t) for t in DEFAULT_PARSERS]
    return ParserRegistry([p for p in chain if isinstance(p, RequestParser)])


def _default(b: _Builder, type_name: str) -> Plugin:
    """A plugin GIE adds by default (it is not one of the configured plugins)."""
    return b.instantiate(
        PluginSpec(name=type_name, type=type_name, parameters={}), f"(default {type_name})", record=False
    )


def _profiles(b: _Builder, plugins: dict[str, Plugin]) -> dict[str, SchedulerProfile]:
    config = b.config
    out: dict[str, SchedulerProfile] = {}
    if not config.profiles:
        # GIE default: one profile named "default" with every Filter, Scorer and Picker plugin (weight 1).
        members: list[tuple[str, float | None, int]] = [(n, None, 0) for n, p in plugins.items() if _is_member(p)]
        out["default"] = _profile(b, "default", members, plugins)
        return out
    for i, prof in enumerate(config.profiles):
        members = [(r.ref, r.weight, r.line) for r in prof.plugins]
        out[prof.name] = _profile(b, prof.name, members, plugins, f"schedulingProfiles[{i}]")
    return out


def _is_member(p: Plugin) -> bool:
    return isinstance(p, Filter | Scorer | Picker) and not isinstance(p, ProfileHandler)


def _profile(
    b: _Builder,
    name: str,
    members: Sequence[tuple[str, float | None, int]],
    plugins: dict[str, Plugin],
    where: str = "schedulingProfiles",
) -> SchedulerProfile:
    source = b.config.source
    filters: list[Filter] = []
    scorers: list[WeightedScorer] = []
    picker: Picker | None = None
    for j, (ref, weight, line) in enumerate(members):
        p = plugins[ref]
        loc = f"{source}:{line}" if line else source
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
        if not used:  # llm-d-router ignores a non-scheduling plugin in a profile (e.g. a tokenizer)
            log.warning(
                "%s: %s.plugins[%d].pluginRef: %r (type %s) is not a filter, scorer or picker: ignored in profile %r",
                loc,
                where,
                j,
                ref,
                p.type_name or "?",
                name,
            )
    if picker is None:
        default = _default(b, "max-score-picker")
        assert isinstance(default, Picker)
        picker = default
    return SchedulerProfile(name, filters, scorers, picker)


def _saturation_detector(b: _Builder, plugins: dict[str, Plugin]) -> SaturationDetector:
    config = b.config
    if config.saturation_detector is not None:
        p = plugins[config.saturation_detector]
        if not isinstance(p, SaturationDetector):
            fc = config.raw.get("flowControl")
            nested = isinstance(fc, dict) and fc.get("saturationDetector") is not None
            holder = (
                fc.get("saturationDetector")
                if isinstance(fc, dict) and nested
                else config.raw.get("saturationDetector")
            )
            path = "flowControl.saturationDetector" if nested else "saturationDetector"
            raise ConfigError(
                f"{config.source}:{line_of(holder, 'pluginRef')}: "
                f"{path}.pluginRef: {p.name!r} is not a saturation detector"
            )
        return p
    # One detector configured without a pluginRef is the one (an admitter that measures saturation for itself is not).
    configured = [p for p in plugins.values() if isinstance(p, SaturationDetector) and not isinstance(p, Admitter)]
    if len(configured) == 1:
        return configured[0]
    default = _default(b, "utilization-detector")
    assert isinstance(default, SaturationDetector)
    return default
