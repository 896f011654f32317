"""pd-profile-handler (the anchors' older P/D name) with the prefill-header-handler: the same routing as
disagg-profile-handler, its threshold and primary port."""

from __future__ import annotations

from epp.framework import (
    PREFILL_HEADER,
)
from epp.framework.keys import DATA_PARALLEL_HEADER
from epp.plugins.deciders.prefix_based_pd_decider import PrefixBasedPDDecider
from epp.plugins.producers.approx_prefix_cache_producer import ApproxPrefixCacheProducer
from epp.plugins.profiles._disagg import PD_DECISIONS, PREFILL_DECODE
from epp.plugins.profiles.pd_profile_handler import PdProfileHandler
from tests.plugins.support_disagg import LONG, ROLE, chat, director, pd_pool, sample


async def test_deprecated_pd_profile_handler_with_prefill_header_handler() -> None:
    ds = pd_pool()
    d = director(ds, sample("llm-d-pd-deprecated.yaml"))
    dec = await d.handle_request(chat(LONG, "d1"))
    assert dec.headers[PREFILL_HEADER] in ("10.0.0.1:8000", "10.0.0.2:8000")
    assert dec.endpoints[0].labels[ROLE] == "decode"


async def test_pd_profile_handler_legacy_threshold_and_primary_port() -> None:
    ds = pd_pool()
    cfg = """
plugins:
- type: prefill-header-handler
- type: prefill-filter
- type: decode-filter
- type: pd-profile-handler
  parameters: {threshold: 10, hashBlockSize: 8, primaryPort: 9000}
schedulingProfiles:
- {name: prefill, plugins: [{pluginRef: prefill-filter}]}
- {name: decode, plugins: [{pluginRef: decode-filter}]}
"""
    d = director(ds, cfg)
    h = d.pipeline.scheduler.handler
    assert isinstance(h, PdProfileHandler) and isinstance(h.decider, PrefixBasedPDDecider)
    assert h.decider.non_cached_tokens == 10
    approx = [p for p in d.pipeline.plugins.values() if isinstance(p, ApproxPrefixCacheProducer)]
    assert len(approx) == 1 and approx[0].block_size_tokens == 8  # hashBlockSize reached the added producer
    dec = await d.handle_request(chat(LONG, "t1"))
    assert dec.endpoints[0].port == 9000 and dec.headers[PREFILL_HEADER].endswith(":8000")
    assert dec.headers[DATA_PARALLEL_HEADER] in ("10.0.0.3:8000", "10.0.0.4:8000")


async def test_pd_profile_handler_counts_pd_decisions_and_sets_no_stage_headers_itself() -> None:
    ds = pd_pool()
    cfg = """
plugins:
- type: prefill-filter
- type: decode-filter
- type: pd-profile-handler
  name: pd
  parameters: {threshold: 10}
schedulingProfiles:
- {name: prefill, plugins: [{pluginRef: prefill-filter}]}
- {name: decode, plugins: [{pluginRef: decode-filter}]}
"""
    d = director(ds, cfg)
    h = d.pipeline.scheduler.handler
    assert isinstance(h, PdProfileHandler)
    counted = PD_DECISIONS.labels("pd", "pd-profile-handler", "m", PREFILL_DECODE)
    before = counted._value.get()
    dec = await d.handle_request(chat(LONG, "c1"))
    assert counted._value.get() == before + 1
    assert dec.endpoints[0].labels[ROLE] == "decode"
    assert PREFILL_HEADER not in dec.headers  # without prefill-header-handler, none is set
    assert h.admission_endpoints(chat("x"), ds.endpoints()) == list(ds.endpoints())
