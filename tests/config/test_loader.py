"""EndpointPickerConfig loading: GIE defaults, sample configs, and errors that name the key and its line."""

from __future__ import annotations

from pathlib import Path

import pytest

from epp.cli import main
from epp.config import ConfigError, load_config, parse_config
from epp.config.loader import GIE_DEFAULT_PLUGINS_YAML
from epp.datalayer.datastore import Datastore
from epp.requestcontrol.director import SchedulingDirector
from epp.wiring import plugin_context
from epp.wiring.builder import Pipeline, build_pipeline
from epp.wiring.runtime import build_runtime

CONFIG_DIR = Path(__file__).resolve().parents[2] / "config"
SAMPLES = [
    "llm-d-precise-prefix.yaml",
    "gie-default.yaml",
    "gie-v1-legacy.yaml",
    "llm-d-approx-prefix.yaml",
    "llm-d-load-aware.yaml",
    "flow-control.yaml",
    "lora-session.yaml",
    "llm-d-optimized-baseline.yaml",
    "llm-d-sticky-precise.yaml",
]


def build(text: str, source: str = "epp.yaml") -> Pipeline:
    return build_pipeline(parse_config(text, source), plugin_context(Datastore()))


def weights(p: Pipeline, profile: str = "default") -> dict[str, float]:
    return {ws.scorer.name: ws.weight for ws in p.scheduler.profiles[profile].scorers}


@pytest.mark.parametrize("name", SAMPLES)
def test_sample_configs_parse_and_build(name: str) -> None:
    cfg = load_config(CONFIG_DIR / name)
    p = build_pipeline(cfg, plugin_context(Datastore()))
    assert p.scheduler.profiles and cfg.warnings == []
    flag = "--allow-experimental-plugins"  # the sample says to run with it
    assert main(["validate", str(CONFIG_DIR / name), *([flag] if flag in (CONFIG_DIR / name).read_text() else [])]) == 0


def test_precise_sample_uses_the_kv_producer_not_the_approximate_one() -> None:
    cfg = load_config(CONFIG_DIR / "llm-d-precise-prefix.yaml")
    p = build_pipeline(cfg, plugin_context(Datastore()))
    assert "approx-prefix-cache-producer" not in p.plugins
    assert [x.name for x in p.producers] == ["token-producer", "precise-prefix-cache-producer"]
    assert weights(p) == {"prefix-cache-scorer": 2.0, "kv-cache-utilization-scorer": 1.0, "queue-scorer": 1.0}


def test_sticky_samples_order_the_load_producer_after_the_prefix_producer() -> None:
    p = build_pipeline(load_config(CONFIG_DIR / "llm-d-optimized-baseline.yaml"), plugin_context(Datastore()))
    assert [x.name for x in p.producers] == ["approx-prefix-cache-producer", "inflight-load-producer"]
    prof = p.scheduler.profiles["default"]
    assert [f.name for f in prof.filters] == ["prefix-cache-affinity-filter"] and weights(p) == {
        "token-load-scorer": 1.0
    }
    p = build_pipeline(load_config(CONFIG_DIR / "llm-d-sticky-precise.yaml"), plugin_context(Datastore()))
    assert "approx-prefix-cache-producer" not in p.plugins
    assert [x.name for x in p.producers] == [
        "token-producer",
        "precise-prefix-cache-producer",
        "inflight-load-producer",
    ]


def test_no_plugins_means_pyepp_default() -> None:
    cfg = parse_config("endpoints: [{address: 10.0.0.1, port: 8000}]\nmodelRewrites: {a: b}\n")
    assert cfg.default_plugins and [e.address for e in cfg.endpoints] == ["10.0.0.1"]
    assert cfg.model_rewrites == {"a": "b"}
    p = build_pipeline(cfg, plugin_context(Datastore()))
    assert weights(p) == {"prefill-cost-scorer": 1.0}
    assert type(p.scheduler.profiles["default"].picker).__name__ == "MaxScorePicker"
    assert type(p.scheduler.handler).__name__ == "SingleProfileHandler"
    assert type(p.saturation_detector).__name__ == "UtilizationDetector"
    # the precise producer (with its approximate fallback) and the token-producer it needs
    assert [x.name for x in p.producers] == ["token-producer", "precise-prefix-cache-producer"]
    assert getattr(p.plugins["precise-prefix-cache-producer"], "fallback", None) is not None
    assert build_runtime(cfg).scraper is not None  # the default metrics source is injected


def test_gie_default_file_equals_gie_builtin_default() -> None:
    explicit = build_pipeline(load_config(CONFIG_DIR / "gie-default.yaml"), plugin_context(Datastore()))
    builtin = build(GIE_DEFAULT_PLUGINS_YAML)
    assert weights(explicit) == weights(builtin)
    assert weights(builtin) == {"queue-scorer": 2.0, "kv-cache-utilization-scorer": 2.0, "prefix-cache-scorer": 3.0}


def test_profile_defaults_weight_picker_and_default_profile() -> None:
    p = build("plugins:\n- type: queue-scorer\n- type: decode-filter\n- type: random-picker\n")
    prof = p.scheduler.profiles["default"]  # no profiles: one named default with every filter/scorer/picker
    assert [f.name for f in prof.filters] == ["decode-filter"]
    assert weights(p) == {"queue-scorer": 1.0} and prof.picker.name == "random-picker"
    p = build(
        "plugins:\n- type: queue-scorer\n- name: q2\n  type: queue-scorer\n"
        "schedulingProfiles:\n- name: p\n  plugins:\n  - pluginRef: queue-scorer\n  - pluginRef: q2\n    weight: 0.5\n"
    )
    assert weights(p, "p") == {"queue-scorer": 1.0, "q2": 0.5}
    assert p.scheduler.profiles["p"].picker.name == "max-score-picker"


def test_flow_control_objectives_and_extension_keys() -> None:
    cfg = load_config(CONFIG_DIR / "flow-control.yaml")
    assert cfg.gate("flowControl")
    fc = cfg.flow_control
    assert fc is not None and fc.max_requests == 10000 and fc.default_request_ttl == 30.0
    assert fc.default_priority_band is not None and fc.default_priority_band.max_bytes == 10**9
    assert [(b.priority, b.max_requests) for b in fc.priority_bands] == [(100, None), (0, None), (-10, 1000)]
    assert fc.priority_bands[0].fairness_policy_ref == "global-strict-fairness-policy"
    assert fc.usage_limit_policy_ref == "static-usage-limit-policy"
    assert cfg.objectives == {"chat-interactive": 100, "standard": 0, "batch-summaries": -10}
    rt = build_runtime(cfg)
    assert rt.objectives.priority("batch-summaries") == -10 and rt.objectives.priority("unknown") == 0
    assert isinstance(rt.director, SchedulingDirector) and rt.director.flow_controller is not None
    assert len(rt.background) >= 2  # metrics scrapers + pool gauges
    cfg2 = parse_config("refreshMetricsInterval: 100ms\nmetricsStalenessThreshold: 3s\npoolName: p1\n")
    assert (cfg2.refresh_metrics_interval, cfg2.metrics_staleness_threshold, cfg2.pool_name) == (0.1, 3.0, "p1")
    assert build_runtime(cfg2).scraper.interval == 0.1  # type: ignore[union-attr]


def test_unknown_top_level_key_is_an_error_with_its_line() -> None:
    with pytest.raises(ConfigError, match=r"^x\.yaml:3: schedulingProfile: unknown top-level key \(allowed: "):
        parse_config("plugins:\n- type: queue-scorer\nschedulingProfile: []\n", "x.yaml")


BAD = [
    ("plugins:\n- type: queue-scorer\nschedulingProfiles: []\n  oops: 1\n", "epp.yaml:4: invalid YAML"),
    ("apiVersion: v9\n", "epp.yaml:1: apiVersion: unsupported 'v9'"),
    ("kind: Deployment\n", "epp.yaml:1: kind: expected EndpointPickerConfig"),
    ("featureGates:\n- dataLayer\n- warpDrive\n", "epp.yaml:3: featureGates[1]: unknown feature gate 'warpDrive'"),
    ("plugins:\n- name: x\n", "epp.yaml:2: plugins[0].type: required"),
    ("plugins:\n- type: queue-scorer\n  paramters: {}\n", "epp.yaml:3: plugins[0].paramters: unknown field"),
    ("plugins:\n- type: queue-scorer\n- type: queue-scorer\n", "epp.yaml:3: plugins[1].name: duplicate plugin name"),
    ("plugins:\n- type: queue-scorer\n  parameters: [1]\n", "epp.yaml:3: plugins[0].parameters: expected a mapping"),
    (
        "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: d\n  plugins:\n  - pluginRef: queue\n",
        "epp.yaml:6: schedulingProfiles[0].plugins[0].pluginRef: no plugin named 'queue'",
    ),
    (
        "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: d\n  plugins:\n  - pluginRef: queue-scorer\n"
        "    weight: heavy\n",
        "epp.yaml:7: schedulingProfiles[0].plugins[0].weight: expected a number",
    ),
    (
        "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: d\n- name: d\n",
        "epp.yaml:5: schedulingProfiles[1].name: duplicate profile name",
    ),
    ("saturationDetector:\n  pluginRef: nope\n", "epp.yaml:2: saturationDetector.pluginRef: no plugin named 'nope'"),
    ("flowControl:\n  maxBytes: lots\n", "epp.yaml:2: flowControl.maxBytes: expected a size"),
    ("flowControl:\n  defaultRequestTTL: forever\n", "epp.yaml:2: flowControl.defaultRequestTTL: expected a duration"),
    (
        "flowControl:\n  priorityBands:\n  - priority: 1\n  - priority: 1\n",
        "epp.yaml:4: flowControl.priorityBands[1].priority: duplicate priority 1",
    ),
    (
        "plugins:\n- type: queue-scorer\nflowControl:\n  priorityBands:\n  - priority: 1\n"
        "    fairnessPolicyRef: fair\n",
        "epp.yaml:6: flowControl.priorityBands[0].fairnessPolicyRef: no plugin named 'fair'",
    ),
    ("objectives:\n- name: a\n  priority: high\n", "epp.yaml:3: objectives[0].priority: expected an integer"),
    ("endpoints:\n- address: 10.0.0.1\n  port: 99999\n", "epp.yaml:3: endpoints[0].port: 99999 is out of range"),
    ("endpoints:\n- address: 10.0.0.1\n", "epp.yaml:2: endpoints[0].port: required"),
    ("refreshMetricsInterval: -5\n", "epp.yaml:1: refreshMetricsInterval:"),
    (
        "plugins:\n- type: queue-scorer\ndataLayer:\n  sources:\n  - pluginRef: metrics-data-source\n",
        "epp.yaml:5: dataLayer.sources[0].pluginRef: no plugin named 'metrics-data-source'",
    ),
]


@pytest.mark.parametrize(("text", "message"), BAD)
def test_bad_structure_names_key_and_line(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as ei:
        build(text)
    assert str(ei.value).startswith(message), str(ei.value)


BAD_PLUGINS = [
    ("plugins:\n- type: fancy-scorer\n", "epp.yaml:2: plugins[0].type: unknown plugin type 'fancy-scorer'"),
    (
        "plugins:\n- type: queue-scorer\n- type: load-aware-scorer\n  parameters:\n    threshold: -3\n",
        "epp.yaml:5: plugins[1].parameters.threshold: load-aware-scorer: parameter 'threshold': must be >= 1, got -3",
    ),
    (
        "plugins:\n- name: ud\n  type: utilization-detector\n  parameters:\n    headroom: 0\n"
        "    metricsStalenessThreshold: 5 minutes\n",
        "epp.yaml:6: plugins[0].parameters.metricsStalenessThreshold: ud: parameter 'metricsStalenessThreshold'",
    ),
    (
        "plugins:\n- type: max-score-picker\n  parameters:\n    maxNumOfEndpoints: two\n",
        "epp.yaml:4: plugins[0].parameters.maxNumOfEndpoints",
    ),
    (
        "plugins:\n- type: metrics-data-source\n  parameters:\n    scheme: ftp\n",
        "epp.yaml:4: plugins[0].parameters.scheme: metrics-data-source: parameter 'scheme': must be one of http, https",
    ),
    (
        "plugins:\n- type: core-metrics-extractor\n  parameters:\n    engineConfigs:\n    - name: x\n"
        "      queuedRequestsSpec: 'bad{{'\n",
        "epp.yaml:4: plugins[0].parameters.engineConfigs",
    ),
    (
        "plugins:\n- type: queue-scorer\n  parameters:\n    threshold: 3\n",
        "epp.yaml:4: plugins[0].parameters.threshold: queue-scorer: unknown parameter 'threshold'",
    ),
    (
        "plugins:\n- type: max-score-picker\n- type: random-picker\nschedulingProfiles:\n- name: d\n  plugins:\n"
        "  - pluginRef: max-score-picker\n  - pluginRef: random-picker\n",
        "epp.yaml:8: schedulingProfiles[0].plugins[1]: profile 'd' has a second picker 'random-picker'",
    ),
    (
        "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: a\n  plugins: []\n- name: b\n  plugins: []\n",
        "epp.yaml: schedulingProfiles: 2 profiles need a profile handler plugin",
    ),
    (
        "plugins:\n- type: queue-scorer\nsaturationDetector:\n  pluginRef: queue-scorer\n",
        "epp.yaml:4: saturationDetector.pluginRef: 'queue-scorer' is not a saturation detector",
    ),
]


@pytest.mark.parametrize(("text", "message"), BAD_PLUGINS)
def test_bad_plugins_name_key_and_line(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as ei:
        build(text)
    assert str(ei.value).startswith(message), str(ei.value)


def test_validate_cli_reports_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("plugins:\n- type: queue-scorer\n  parameters:\n    x: 1\n- type: nope-scorer\n")
    assert main(["validate", str(bad)]) == 1
    assert f"{bad}:4: plugins[0].parameters.x: queue-scorer: unknown parameter 'x'" in capsys.readouterr().err
    bad.write_text("plugins:\n- type: queue-scorer\n- type: nope-scorer\n")
    assert main(["validate", str(bad)]) == 1
    assert f"{bad}:3: plugins[1].type: unknown plugin type 'nope-scorer'" in capsys.readouterr().err
    assert main(["validate", str(tmp_path / "missing.yaml")]) == 1
    assert "cannot read config" in capsys.readouterr().err
    # what `epp serve` refuses, validate refuses: an Alpha plugin without --allow-experimental-plugins
    alpha = tmp_path / "alpha.yaml"
    alpha.write_text("plugins:\n- type: session-affinity-scorer\n")
    assert main(["validate", str(alpha)]) == 1
    assert "has Alpha stability level" in capsys.readouterr().err
    assert main(["validate", str(alpha), "--allow-experimental-plugins"]) == 0
    assert "ok (" in capsys.readouterr().out


def test_raw_config_round_trips_through_yaml_and_json() -> None:
    import json

    import yaml

    cfg = parse_config("poolName: p\nendpoints:\n- {address: 10.0.0.1, port: 80, labels: {a: b}}\n")
    assert yaml.safe_load(yaml.safe_dump(cfg.raw)) == cfg.raw
    assert json.loads(json.dumps(cfg.raw)) == cfg.raw


def test_a_cross_replica_address_alone_shares_the_default_chains_state() -> None:
    """`--cross-replica-address`: the default config gets a syncer with that address and nothing else, and every
    plugin of it with state to share (precise producer's speculative entries, prefill-cost bookings) is attached;
    a file that names its own syncer keeps it."""
    from epp.datalayer.datastore import Datastore
    from epp.datalayer.plugins.redis_cross_replica_syncer import RedisCrossReplicaSyncer
    from epp.server.options import parse_options
    from epp.wiring import build_pipeline, plugin_context

    opts = parse_options(["--cross-replica-address", "valkey://state:6379"])
    config = parse_config("")
    assert config.share_state_through(opts.cross_replica_address) == "cross-replica-syncer"
    pipeline = build_pipeline(config, plugin_context(Datastore()))
    syncer = pipeline.plugins["cross-replica-syncer"]
    assert isinstance(syncer, RedisCrossReplicaSyncer) and syncer.address == "valkey://state:6379"
    assert sorted(syncer.messengers) == [
        "prefill-cost:prefill-cost-scorer",
        "speculative:precise-prefix-cache-producer",
    ]
    own = parse_config(
        "plugins: [{type: local-syncer, name: mine}, {type: queue-scorer}]\n"
        "dataLayer: {crossReplicaSyncerPluginRef: mine}\n"
    )
    assert own.share_state_through("redis://x:1") == "mine" and len(own.plugins) == 2
