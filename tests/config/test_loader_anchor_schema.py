"""Schema llm-d-router v0.10 accepts: each field loads and takes effect (or is checked), bad values name the line."""

from __future__ import annotations

import logging

import pytest

from epp.config.loader import ConfigError, parse_config
from epp.datalayer.datastore import Datastore
from epp.datalayer.extractor import BUILTIN_ENGINES
from epp.requestcontrol.pipeline import Pipeline
from epp.wiring import build_pipeline, build_runtime, plugin_context

SRC = "epp.yaml"


def build(text: str) -> Pipeline:
    return build_pipeline(parse_config(text, SRC), plugin_context(Datastore()))


def test_feature_gates_take_go_bool_values_and_defaults() -> None:
    cfg = parse_config("featureGates:\n- flowControl\n- haPopulateNonLeaderDatastore=false\n", SRC)
    assert cfg.gate("flowControl") is True and cfg.gate("haPopulateNonLeaderDatastore") is False
    off = parse_config("featureGates:\n- flowControl=FALSE\n- dataLayer=1\n", SRC)
    assert off.gate("flowControl") is False and off.gate("dataLayer") is True
    assert parse_config("{}", SRC).gate("haPopulateNonLeaderDatastore") is True  # registered default on
    with pytest.raises(ConfigError, match=r"^epp\.yaml:2: featureGates\[0\]: 'maybe' is not a valid value"):
        parse_config("featureGates:\n- flowControl=maybe\n", SRC)
    with pytest.raises(ConfigError, match=r"^epp\.yaml:2: featureGates\[0\]: unknown feature gate 'warp'"):
        parse_config("featureGates:\n- warp=true\n", SRC)


def test_flow_control_section_fields() -> None:
    cfg = parse_config(
        "plugins:\n- type: utilization-detector\nflowControl:\n  saturationDetector:\n"
        "    pluginRef: utilization-detector\n"
        "  enableEviction: true\n  noEndpointRequestTTL: 5s\n  defaultNegativePriorityBand:\n    maxRequests: 7\n",
        SRC,
    )
    fc = cfg.flow_control
    assert fc is not None and fc.enable_eviction and fc.no_endpoint_request_ttl == 5.0
    assert fc.default_negative_priority_band is not None and fc.default_negative_priority_band.max_requests == 7
    assert fc.default_negative_priority_band.priority == -1
    assert cfg.saturation_detector == "utilization-detector"
    with pytest.raises(ConfigError, match=r"^epp\.yaml:3: flowControl\.enableEviction: expected true or false"):
        parse_config("flowControl:\n  saturationDetector: null\n  enableEviction: maybe\n", SRC)
    with pytest.raises(ConfigError, match=r"^epp\.yaml:3: flowControl\.saturationDetector\.pluginRef: no plugin"):
        parse_config("flowControl:\n  saturationDetector:\n    pluginRef: nope\n", SRC)


def test_the_deprecated_top_level_detector_maps_and_the_new_field_wins() -> None:
    two = "plugins:\n- name: a\n  type: utilization-detector\n- name: b\n  type: utilization-detector\n"
    old = parse_config(two + "saturationDetector:\n  pluginRef: a\n", SRC)
    assert old.saturation_detector == "a" and any("deprecated" in w for w in old.warnings)
    both = parse_config(
        two + "saturationDetector:\n  pluginRef: a\nflowControl:\n  saturationDetector:\n    pluginRef: b\n", SRC
    )
    assert both.saturation_detector == "b"
    assert build(two + "flowControl:\n  saturationDetector:\n    pluginRef: b\n").saturation_detector.name == "b"


def test_data_layer_discovery_and_inject_defaults() -> None:
    cfg = parse_config(
        "plugins:\n- type: file-discovery\n  parameters:\n    path: /x.yaml\n"
        "dataLayer:\n  injectDefaults: false\n  discovery:\n    pluginRef: file-discovery\n",
        SRC,
    )
    assert cfg.inject_data_defaults is False and cfg.discovery_ref == "file-discovery"
    with pytest.raises(ConfigError, match=r"^epp\.yaml:3: dataLayer\.discovery\.pluginRef: no plugin named 'nope'"):
        parse_config("dataLayer:\n  discovery:\n    pluginRef: nope\n", SRC)
    with pytest.raises(ConfigError, match=r"^epp\.yaml:2: dataLayer\.injectDefaults: expected true or false"):
        parse_config("dataLayer:\n  injectDefaults: sometimes\n", SRC)


def test_discovery_plugin_replaces_static_discovery(tmp_path: object) -> None:
    runtime = build_runtime(
        parse_config(
            "plugins:\n- type: file-discovery\n  parameters:\n    path: /nowhere.yaml\n"
            "dataLayer:\n  discovery:\n    pluginRef: file-discovery\n",
            SRC,
        )
    )
    assert [type(s).__name__ for s in runtime.sources] == ["FileDiscovery"]


def test_request_handler_parsers_in_order_and_the_legacy_parser() -> None:
    p = build(
        "plugins:\n- type: openai-parser\n- type: passthrough-parser\nrequestHandler:\n  parsers:\n"
        "  - pluginRef: passthrough-parser\n  - pluginRef: openai-parser\n"
    )
    assert [x.name for x in p.parsers] == ["passthrough-parser", "openai-parser"]
    assert [
        x.name for x in build("plugins:\n- type: openai-parser\nparser:\n  pluginRef: openai-parser\n").parsers
    ] == ["openai-parser"]
    with pytest.raises(ConfigError, match=r"^epp\.yaml:5: requestHandler\.parsers\[0\]\.pluginRef: no plugin named"):
        parse_config("plugins:\n- type: openai-parser\nrequestHandler:\n  parsers:\n  - pluginRef: vllm\n", SRC)
    with pytest.raises(ConfigError, match=r"requestHandler\.parsers: 'queue-scorer' is not a parser"):
        build("plugins:\n- type: queue-scorer\nrequestHandler:\n  parsers:\n  - pluginRef: queue-scorer\n")


def test_a_non_scheduling_plugin_in_a_profile_is_ignored(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    p = build(
        "plugins:\n- type: token-producer\n- type: queue-scorer\nschedulingProfiles:\n- name: d\n  plugins:\n"
        "  - pluginRef: token-producer\n  - pluginRef: queue-scorer\n"
    )
    prof = p.scheduler.profiles["d"]
    assert [ws.scorer.name for ws in prof.scorers] == ["queue-scorer"] and prof.filters == []
    assert "'token-producer' (type token-producer) is not a filter, scorer or picker: ignored" in caplog.text


def test_unknown_parameters_are_errors_with_their_line_nested_too() -> None:
    with pytest.raises(ConfigError, match=r"^epp\.yaml:4: plugins\[0\]\.parameters\.maxNumOfEndpoint: "):
        build("plugins:\n- type: max-score-picker\n  parameters:\n    maxNumOfEndpoint: 2\n")
    with pytest.raises(ConfigError) as ei:
        build(
            "plugins:\n- type: precise-prefix-cache-scorer\n  parameters:\n    kvEventsConfig:\n"
            "      discoverPods: false\n      topicFiltr: kv\n"
        )
    assert str(ei.value).startswith("epp.yaml:6: plugins[0].parameters.kvEventsConfig.topicFiltr: "), str(ei.value)


def test_triton_engine_and_llm_d_v1_api_version() -> None:
    assert "triton" in BUILTIN_ENGINES and BUILTIN_ENGINES["triton"].queued
    build(
        "apiVersion: llm-d.ai/v1\nplugins:\n- type: core-metrics-extractor\n  parameters:\n    defaultEngine: triton\n"
    )
