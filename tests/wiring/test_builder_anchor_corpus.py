"""The anchors' own EndpointPickerConfigs (tests/corpus/anchors, provenance in manifest.tsv): each loads and builds
into the plugin graph the anchor would build, or fails for the documented reason in exceptions.tsv.

The expected graph is read from the file with plain YAML, independently of our loader: every declared plugin is
built with its declared type, every profile has exactly its declared filters, weighted scorers (weight 1 when
unset) and picker (max-score-picker when unset), the handler is the declared one (single-profile-handler when none),
the declared parser chain is the request handler's, and every parameter was read (the builder rejects unknown ones).
"""

from __future__ import annotations

import csv
import logging
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from epp.config.loader import ConfigError, load_config
from epp.datalayer.datastore import Datastore
from epp.framework import Filter, Picker, Plugin, ProfileHandler, Scorer
from epp.requestcontrol.pipeline import Pipeline
from epp.wiring import build_pipeline, plugin_context

CORPUS = Path(__file__).parent.parent / "corpus"
ANCHORS = CORPUS / "anchors"


def _tsv(name: str) -> list[dict[str, str]]:
    with open(CORPUS / name, newline="") as f:
        return list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))


MANIFEST = {r["file"]: r for r in _tsv("manifest.tsv")}
EXCEPTIONS = {r["file"]: r for r in _tsv("exceptions.tsv")}
NOT_REAL = ("fragment", "test-only")  # not a config a user could run: excluded from the real total


def _build(name: str) -> Pipeline:
    return build_pipeline(load_config(ANCHORS / name), plugin_context(Datastore()))


def test_every_corpus_file_has_its_source_and_commit() -> None:
    files = {p.name for p in ANCHORS.glob("*.yaml")}
    assert files == set(MANIFEST), "anchors/ and manifest.tsv must list the same files"
    for row in MANIFEST.values():
        assert re.fullmatch(r"[\w.-]+/[\w.-]+", row["repo"]), row
        assert re.fullmatch(r"[0-9a-f]{40}", row["commit"]), row
        assert row["path"] and row["where"], row
    assert set(EXCEPTIONS) <= set(MANIFEST)
    assert {r["kind"] for r in EXCEPTIONS.values()} <= {*NOT_REAL, "anchor-rejects", "unsupported", "pending"}


def _type_matches(plugin: Plugin, declared: str) -> bool:
    return declared in (plugin.type_name, *getattr(plugin, "aliases", ()))


def _expect_graph(name: str, pipeline: Pipeline) -> None:
    raw: dict[str, Any] = yaml.safe_load((ANCHORS / name).read_text()) or {}
    declared = {p.get("name") or p["type"]: p["type"] for p in raw.get("plugins") or []}
    for pname, ptype in declared.items():
        assert pname in pipeline.plugins, f"{name}: plugin {pname!r} not built"
        assert _type_matches(pipeline.plugins[pname], ptype), f"{name}: {pname!r} built as {pipeline.plugins[pname]}"
    profiles = raw.get("schedulingProfiles") or []
    sched = pipeline.scheduler
    if not raw.get("plugins") and not profiles:
        assert list(sched.profiles) == ["default"]  # GIE's default config
        return
    if profiles:
        assert list(sched.profiles) == [p["name"] for p in profiles], name
    for prof in profiles:
        built = sched.profiles[prof["name"]]
        refs = [(r["pluginRef"], r.get("weight")) for r in prof.get("plugins") or []]
        members = {ref: pipeline.plugins[ref] for ref, _ in refs}
        filters = [ref for ref, _ in refs if isinstance(members[ref], Filter)]
        scorers = [(ref, 1.0 if w is None else float(w)) for ref, w in refs if isinstance(members[ref], Scorer)]
        pickers = [ref for ref, _ in refs if isinstance(members[ref], Picker)]
        assert [f.name for f in built.filters] == filters, f"{name}: {prof['name']} filters"
        assert [(ws.scorer.name, float(ws.weight)) for ws in built.scorers] == scorers, f"{name}: {prof['name']}"
        assert built.picker.name == (pickers[0] if pickers else "max-score-picker"), f"{name}: {prof['name']} picker"
    handlers = [n for n, p in pipeline.plugins.items() if isinstance(p, ProfileHandler)]
    assert sched.handler.name == (handlers[0] if handlers else "single-profile-handler"), name
    parsers = [p["pluginRef"] for p in (raw.get("requestHandler") or {}).get("parsers") or []]
    if not parsers and raw.get("parser"):
        parsers = [raw["parser"]["pluginRef"]]
    assert [p.name for p in pipeline.parsers] == parsers, f"{name}: request handler parsers"


LOADING = sorted(set(MANIFEST) - set(EXCEPTIONS))


@pytest.mark.parametrize("name", LOADING)
def test_anchor_config_builds_the_anchors_graph(name: str) -> None:
    _expect_graph(name, _build(name))


REFUSED = sorted(f for f, r in EXCEPTIONS.items() if r["kind"] != "pending")


@pytest.mark.parametrize("name", REFUSED)
def test_anchor_config_is_refused_for_its_documented_reason(name: str) -> None:
    with pytest.raises(ConfigError) as ei:
        _build(name)
    msg = str(ei.value)
    assert msg.startswith(str(ANCHORS / name)), msg  # names the file (and the line where there is one)
    assert EXCEPTIONS[name]["expect"] in msg, msg


PENDING = sorted(f for f, r in EXCEPTIONS.items() if r["kind"] == "pending")


def test_pending_configs_fail_cleanly_or_build() -> None:
    """Each waits for a plugin type another issue builds: a clear error until it lands, then the anchor's graph.
    (One test over the list, which may be empty.)"""
    for name in PENDING:
        try:
            pipeline = _build(name)
        except ConfigError as e:
            assert str(e).startswith(str(ANCHORS / name)), str(e)
            continue
        _expect_graph(name, pipeline)


def test_corpus_count(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)
    real = [f for f in MANIFEST if EXCEPTIONS.get(f, {}).get("kind") not in NOT_REAL]
    loaded = []
    for f in real:
        try:
            _build(f)
            loaded.append(f)
        except ConfigError:
            pass
    # the floor rises as catalog plugins land (docs/compatibility.md has the current count)
    assert len(loaded) >= len(LOADING)
    print(f"corpus: {len(loaded)}/{len(real)} real configs load")


def _plugin(p: Pipeline, name: str) -> Any:
    return p.plugins[name]


# Parameters in effect, on the built objects, for a few anchors (the builder already rejects unread parameters).
SPOT_CHECKS: dict[str, Any] = {
    # GIE's --config-text example: the scorer's producer parameters reach the producer added for it
    "gie__site-src__guides__epp-configuration__config-text__3_embedded.yaml": lambda p: (
        _plugin(p, "approx-prefix-cache-producer").block_size_tokens == 5
        and _plugin(p, "approx-prefix-cache-producer").max_blocks == 256
        and _plugin(p, "approx-prefix-cache-producer").index.capacity == 31250
        and [(ws.scorer.name, ws.weight) for ws in p.scheduler.profiles["default"].scorers]
        == [("prefix-cache-scorer", 50.0)]
    ),
    # flowControl.saturationDetector (the new field) picks the detector; the admitter runs with its defaults
    "llm-d-router__deploy__config__probabilistic-admitter-epp-config.yaml": lambda p: (
        p.saturation_detector.name == "utilization-detector"
        and _plugin(p, "utilization-detector").queue_threshold == 999999999
        and _plugin(p, "probabilistic-admitter").power == 5.0
        and _plugin(p, "probabilistic-admitter") in p.admitters
    ),
    "llm-d-router__deploy__config__dp-epp-config.yaml": lambda p: (
        p.scheduler.handler.name == "data-parallel-profile-handler" and p.scheduler.handler.primary_port == 8000
    ),
    "llm-d-router__deploy__config__pd-topology-epp-config.yaml": lambda p: (
        _plugin(p, "topology-affinity-filter").floor == 0  # minAffinity: host
        and [ws.scorer.name for ws in p.scheduler.profiles["prefill"].scorers][-1] == "topology-affinity-scorer"
    ),
    # requestHandler.parsers selects the router's parser chain
    "llm-d-router__config__charts__routerlib__templates___config__payload-agnostic.yaml": lambda p: (
        [x.name for x in p.parsers] == ["passthrough-parser"]
    ),
    # the affinity filters' TTFT gate reads the predicted-latency-producer's predictions (its typed key)
    "llm-d-router__config__charts__routerlib__templates___config__default-plugins_latency-predictor.yaml": lambda p: (
        _plugin(p, "strict-affinity-filter").ttft_key == _plugin(p, "predicted-latency-producer").info_key
        and _plugin(p, "loose-affinity-filter").ttft_key == _plugin(p, "predicted-latency-producer").info_key
        and _plugin(p, "strict-affinity-filter").threshold == 0.99
        and _plugin(p, "loose-affinity-filter").threshold == 0.8
        and _plugin(p, "strict-affinity-filter").max_penalty == 5000
        and [f.name for f in p.scheduler.profiles["default"].filters]
        == ["strict-affinity-filter", "slo-headroom-tier-filter", "loose-affinity-filter"]
    ),
    "llm-d__guides__predicted-latency-routing__router__predicted-latency.values.yaml": lambda p: (
        _plugin(p, "loose-affinity-filter").ttft_key == _plugin(p, "predicted-latency-producer").info_key
        and _plugin(p, "loose-affinity-filter").source == "latencyPredictor"
        and _plugin(p, "approx-prefix-cache-producer").max_blocks == 262144 // 16
    ),
    # token-producer's estimate backend feeds context-length-aware's token count
    "llm-d__guides__context-length-aware-pd__router.values.yaml": lambda p: (
        _plugin(p, "token-producer").estimator is not None
        and _plugin(p, "token-producer").tokenizer is None
        and _plugin(p, "context-length-aware").enable_filtering
    ),
    "llm-d__guides__multimodal-serving__e-disaggregation__router__vllm__e-p-d-disaggregation.values.yaml": lambda p: (
        (_plugin(p, "token-producer").estimator.image.width, _plugin(p, "token-producer").estimator.image.height)
        == (1280, 720)
        and _plugin(p, "token-producer").estimator.image.factor == 1024
        and _plugin(p, "prefix-cache-affinity-filter").peak == 15751
    ),
    # the deprecated UDS tokenizer sidecar: the token-producer is its gRPC client, for the configured model
    **{
        f"llm-d__guides__precise-prefix-cache-{g}.values.yaml": lambda p: (
            _plugin(p, "tokenizer").tokenizer.backend.target == "unix:///tmp/tokenizer/tokenizer-uds.socket"
            and _plugin(p, "tokenizer").tokenizer.backend.model == "Qwen/Qwen3-32B"
            and _plugin(p, "tokenizer").tokenizer.backend.max_in_flight == 0
        )
        for g in ("aware__scheduler__precise-prefix-cache-aware", "routing__router__precise-prefix-cache-routing")
    },
    # v0.10's per-pick decay (llm-d-router main later dropped it for a 60 s half-life)
    "llm-d__guides__agentic-serving__router__fairness-las-plugins.yaml": lambda p: (
        _plugin(p, "program-aware-fairness").decay_factor == 0.99997
        and _plugin(p, "program-aware-fairness").half_life == 0.0
    ),
    "llm-d-router__deploy__config__soft-reflective-ceiling-epp-config.yaml": lambda p: (
        _plugin(p, "soft-reflective-ceiling-policy").ceilings(0.2, [1, 0]) == [1.0, float("inf")]
    ),
}


@pytest.mark.parametrize("name", sorted(SPOT_CHECKS))
def test_parameters_in_effect(name: str) -> None:
    assert SPOT_CHECKS[name](_build(name)), name


def test_every_exception_is_documented_with_its_reason() -> None:
    doc = (Path(__file__).parent.parent.parent / "docs" / "compatibility.md").read_text()
    for name, row in EXCEPTIONS.items():
        assert f"`{name}`" in doc, f"docs/compatibility.md does not list {name}"
        assert row["reason"].replace("|", "/") in doc, f"docs/compatibility.md lacks the reason for {name}"
