"""P/D and E/P/D disaggregation through disagg-profile-handler: the anchors' P/D configs, the headers for the decode
pod's sidecar, speculative prefix entries for both pods and stage-aware admission."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import pytest

from epp.config import ConfigError, load_config, parse_config
from epp.datalayer.datastore import Datastore
from epp.framework import (
    DISAGG_DECISION,
    ENCODER_HEADER,
    PEER_ENDPOINT,
    PREFILL_HEADER,
    CycleState,
    Endpoint,
    InferenceRequest,
    Metrics,
    Plugin,
    PluginRegistry,
    TooManyRequests,
)
from epp.plugins.deciders.prefix_based_pd_decider import PrefixBasedPDDecider
from epp.plugins.producers.approx_prefix_cache_producer import ApproxPrefixCacheProducer
from epp.plugins.profiles._disagg import DISAGG_DECISIONS
from epp.plugins.profiles.disagg_profile_handler import DisaggProfileHandler
from epp.plugins.profiles.pd_profile_handler import PdProfileHandler
from epp.wiring import plugin_context
from epp.wiring.builder import build_pipeline
from epp.wiring.builtins import register_builtins
from tests.plugins.support_disagg import CONFIG_DIR, LONG, ROLE, chat, director, pd_pool, sample

PD_SAMPLES = ["llm-d-pd.yaml", "llm-d-sim-pd.yaml", "llm-d-sim-e-pd.yaml", "llm-d-pd-deprecated.yaml", "llm-d-epd.yaml"]


class PeerProbe(Plugin):
    """A filter that records the PEER_ENDPOINT the handler published in the CycleState."""

    type_name = "peer-probe"
    seen: list[str | None] = []

    def filter(self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[Endpoint]:
        peer = state.get(PEER_ENDPOINT)
        PeerProbe.seen.append(peer.name if peer else None)
        return list(endpoints)


@pytest.mark.parametrize("name", PD_SAMPLES)
def test_anchor_pd_configs_build(name: str) -> None:
    p = build_pipeline(load_config(CONFIG_DIR / name), plugin_context(Datastore()))
    handler = p.scheduler.handler
    assert isinstance(handler, DisaggProfileHandler | PdProfileHandler)
    assert "decode" in p.scheduler.profiles


def test_handler_resolves_a_decider_declared_after_it() -> None:
    # pd-epp-config.yaml declares disagg-profile-handler before prefix-based-pd-decider.
    p = build_pipeline(load_config(CONFIG_DIR / "llm-d-pd.yaml"), plugin_context(Datastore()))
    h = p.scheduler.handler
    assert isinstance(h, DisaggProfileHandler) and isinstance(h.prefill_decider, PrefixBasedPDDecider)
    assert h.prefill_decider.non_cached_tokens == 16 and h.encode_decider is None


async def test_long_uncached_prompt_goes_prefill_then_decode_and_cached_stays_on_decode() -> None:
    ds = pd_pool()
    d = director(ds, sample("llm-d-pd.yaml"))
    counter = DISAGG_DECISIONS.labels("disagg-profile-handler", "disagg-profile-handler", "m", "prefill-decode")
    before = counter._value.get()
    first = await d.handle_request(chat(LONG + "Q1", "r1"))
    decode_hp = first.destination
    assert decode_hp in ("10.0.0.3:8000", "10.0.0.4:8000")
    assert first.headers[PREFILL_HEADER] in ("10.0.0.1:8000", "10.0.0.2:8000")
    assert counter._value.get() == before + 1
    await asyncio.sleep(0)  # the approximate index records both pods right after the decision
    # Same prompt again: the decode pod holds it, < 16 uncached tokens → decode only, same decode pod.
    again = await d.handle_request(chat(LONG + "Q1", "r2"))
    assert again.destination == decode_hp and PREFILL_HEADER not in again.headers
    # A short prompt never reaches the threshold of 16 tokens.
    short = await d.handle_request(chat("hi there", "r3"))
    assert PREFILL_HEADER not in short.headers
    assert short.endpoints[0].labels[ROLE] == "decode"


async def test_client_sent_prefill_header_is_replaced_or_dropped() -> None:
    ds = pd_pool()
    d = director(ds, sample("llm-d-pd.yaml"))
    forged = {PREFILL_HEADER: "169.254.169.254:80", ENCODER_HEADER: "evil:1"}
    dis = await d.handle_request(chat(LONG + "forge", "f1", headers=dict(forged)))
    assert dis.headers[PREFILL_HEADER] in ("10.0.0.1:8000", "10.0.0.2:8000")
    assert ENCODER_HEADER not in dis.headers  # the server removes a header no plugin set
    short = await d.handle_request(chat("hi", "f2", headers=dict(forged)))
    assert PREFILL_HEADER not in short.headers


async def test_speculative_prefix_entries_for_decode_and_prefill_pods() -> None:
    ds = pd_pool()
    d = director(ds, sample("llm-d-pd.yaml"))
    dec = await d.handle_request(chat(LONG + "spec", "s1"))
    await asyncio.sleep(0)
    producer = next(p for p in d.pipeline.plugins.values() if isinstance(p, ApproxPrefixCacheProducer))
    decision_pods = {dec.endpoints[0].name, ds.get_by_hostport(dec.headers[PREFILL_HEADER]).name}  # type: ignore[union-attr]
    assert {name for name in ("pod-0", "pod-1", "pod-2", "pod-3") if producer.index.size(name)} == decision_pods


async def test_epd_sets_encoder_and_prefiller_headers() -> None:
    ds = pd_pool(("encode", "encode", "prefill", "decode"))
    d = director(ds, sample("llm-d-epd.yaml"))
    image = [{"type": "text", "text": LONG}, {"type": "image_url", "image_url": {"url": "data:x"}}]
    dec = await d.handle_request(chat("", "e1", content=image))
    assert dec.destination == "10.0.0.4:8000"
    assert dec.headers[ENCODER_HEADER] in ("10.0.0.1:8000", "10.0.0.2:8000")
    assert dec.headers[PREFILL_HEADER] == "10.0.0.3:8000"
    text = await d.handle_request(chat("short text", "e2"))
    assert ENCODER_HEADER not in text.headers and PREFILL_HEADER not in text.headers


async def test_prefill_first_order_and_peer_endpoint() -> None:
    registry = register_builtins(PluginRegistry())
    registry.register(PeerProbe)
    ds = pd_pool(("prefill", "decode"))
    cfg = """
plugins:
- type: prefill-filter
- type: decode-filter
- type: peer-probe
- type: disagg-profile-handler
  parameters: {stageOrder: prefill-first}
schedulingProfiles:
- name: prefill
  plugins: [{pluginRef: prefill-filter}, {pluginRef: peer-probe}]
- name: decode
  plugins: [{pluginRef: decode-filter}, {pluginRef: peer-probe}]
"""
    PeerProbe.seen = []
    dec = await director(ds, cfg, registry).handle_request(chat("hello", "p1"))
    assert PeerProbe.seen == [None, "pod-0"]  # prefill ran first; decode saw the prefill pick
    assert dec.destination == "10.0.0.2:8000" and dec.headers[PREFILL_HEADER] == "10.0.0.1:8000"
    # decode-first with always-disagg: the prefill profile sees the decode pick
    PeerProbe.seen = []
    cfg2 = cfg.replace("parameters: {stageOrder: prefill-first}", "parameters: {deciders: {prefill: always}}")
    always = "- {type: always-disagg-pd-decider, name: always}\n"
    cfg2 = cfg2.replace("- type: peer-probe\n", "- type: peer-probe\n" + always)
    dec2 = await director(ds, cfg2, registry).handle_request(chat("hello", "p2"))
    assert PeerProbe.seen == [None, "pod-1"]
    assert dec2.destination == "10.0.0.2:8000" and dec2.headers[PREFILL_HEADER] == "10.0.0.1:8000"


async def test_saturated_prefill_pool_does_not_shed_decode_only_requests() -> None:
    ds = pd_pool()
    objectives = "objectives:\n- {name: batch, priority: -1}\n"
    d = director(ds, sample("llm-d-pd.yaml") + objectives)
    for e in ds.endpoints()[:2]:  # both prefill pods far past the queue threshold
        e.metrics = Metrics(waiting_queue_size=50, update_time=time.monotonic())
    batch = {"x-gateway-inference-objective": "batch"}
    assert (await d.handle_request(chat("hi", "b1", headers=dict(batch)))).endpoints
    for e in ds.endpoints()[2:]:
        e.metrics = Metrics(waiting_queue_size=50, update_time=time.monotonic())
    with pytest.raises(TooManyRequests):
        await d.handle_request(chat("hi", "b2", headers=dict(batch)))


async def test_no_prefill_pod_left_means_decode_only() -> None:
    ds = pd_pool(("decode", "decode"))
    d = director(ds, sample("llm-d-pd.yaml"))
    dec = await d.handle_request(chat(LONG, "n1"))
    assert PREFILL_HEADER not in dec.headers and dec.result is not None
    assert "prefill" not in dec.result.profile_results
    req = chat(LONG, "n2")
    await d.handle_request(req)
    decision = req.data.get(DISAGG_DECISION)
    assert decision is not None and decision.prefill is None and decision.decode.name in ("pod-0", "pod-1")


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ("{deciders: {prefill: nope}}", "plugins[1].parameters.deciders.prefill: "),
        ("{deciders: {prefill: prefill-filter}}", "is not a disaggregation decider"),
        ("{deciders: {prefil: x}}", "plugins[1].parameters.deciders.prefil: disagg-profile-handler: unknown parameter"),
        ("{profiles: {decod: d}}", "plugins[1].parameters.profiles.decod: disagg-profile-handler: unknown parameter"),
        ("{profiles: {decode: d}, decodeProfile: d}", "use one format"),
        ("{stageOrder: sideways}", "stageOrder"),
        ("{stageOrder: prefill-first, deciders: {prefill: dec}}", "not supported with stageOrder prefill-first"),
    ],
)
def test_handler_parameter_errors_name_key_and_line(params: str, message: str) -> None:
    text = f"""plugins:
- type: prefill-filter
- type: disagg-profile-handler
  parameters: {params}
- {{type: always-disagg-pd-decider, name: dec}}
schedulingProfiles:
- {{name: decode, plugins: [{{pluginRef: prefill-filter}}]}}
"""
    with pytest.raises(ConfigError) as ei:
        build_pipeline(parse_config(text, "pd.yaml"), plugin_context(Datastore()))
    assert message in str(ei.value) and str(ei.value).startswith("pd.yaml:")


def test_legacy_flat_parameters_load() -> None:
    text = """plugins:
- {type: always-disagg-pd-decider, name: dec}
- type: disagg-profile-handler
  parameters: {decodeProfile: d, prefillProfile: p, deciderPluginName: dec}
schedulingProfiles:
- {name: d, plugins: []}
- {name: p, plugins: []}
"""
    h = build_pipeline(parse_config(text), plugin_context(Datastore())).scheduler.handler
    assert isinstance(h, DisaggProfileHandler)
    assert (h.decode_profile, h.prefill_profile, h.prefill_decider is not None) == ("d", "p", True)
