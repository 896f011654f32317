"""pd-profile-handler (llm-d's older name; the anchors' P/D configs still use it): disagg-profile-handler's
decode-first P/D with the older parameters and behaviour.

It sets no stage headers (pair it with prefill-header-handler, which sets `x-prefiller-host-port`), counts
`llm_d_epp_pd_decision_total`, and measures admission over all candidates, as llm-d's does. Parameters as in llm-d:
`decodeProfile`, `prefillProfile`, `deciderPluginName` (default prefix-based-pd-decider), `prefixPluginName`/
`prefixPluginType` and `prefixMatchInfoProducerName` (which prefix producer the threshold decider reads),
`primaryPort` (decode targets get this port; the chosen pod's `ip:port` goes to `x-data-parallel-host-port`). The
first releases' `threshold` (uncached tokens) and `hashBlockSize` still load: without a plugin named
`deciderPluginName`, `threshold` builds the handler's own prefix-based decider (`nonCachedTokens: threshold`), and
`hashBlockSize` is the block size of the approx-prefix-cache-producer added for it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Self

from epp.framework import (
    DATA_PARALLEL_HEADER,
    CycleState,
    DisaggDecider,
    Endpoint,
    InferenceRequest,
    Params,
    Plugin,
    PluginContext,
    ProfileResult,
    SchedulingResult,
)
from epp.plugins.contracts.disagg import upstream_headers
from epp.plugins.contracts.prefix import PREFIX_MATCH
from epp.plugins.deciders.prefix_based_pd_decider import PrefixBasedPDDecider
from epp.plugins.profiles._disagg import DECODE_ONLY, PD_DECISIONS, PREFILL_DECODE, model_label
from epp.plugins.profiles.disagg_profile_handler import DisaggProfileHandler

log = logging.getLogger(__name__)

DEFAULT_DECIDER = "prefix-based-pd-decider"
_MATCH_INFO = PREFIX_MATCH.key.name + "/"


class PdProfileHandler(DisaggProfileHandler):
    type_name = "pd-profile-handler"

    def __init__(
        self,
        name: str | None = None,
        *,
        decode_profile: str = "decode",
        prefill_profile: str = "prefill",
        primary_port: int = 0,
    ) -> None:
        # no encode stage: pd-profile-handler is P/D only
        super().__init__(name, decode_profile=decode_profile, prefill_profile=prefill_profile, encode_profile="")
        self.primary_port = primary_port
        self._params: Params | None = None
        self._decider_name = DEFAULT_DECIDER
        self._prefix_plugin = ""
        self._producer = ""
        self._threshold: int | None = None
        self._hash_block_size: int | None = None

    @property
    def decider(self) -> DisaggDecider | None:
        return self.prefill_decider

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        log.warning("%s: pd-profile-handler is deprecated, use disagg-profile-handler", name)
        handler = cls(
            name,
            decode_profile=params.str("decodeProfile", "decode") or "decode",
            prefill_profile=params.str("prefillProfile", "prefill") or "prefill",
            primary_port=params.int("primaryPort", 0, min=0, max=65535),
        )
        if handler.primary_port:
            log.warning("%s: primaryPort is deprecated (not needed with Istio >= 1.28.1)", name)
        handler._params = params
        handler._decider_name = params.str("deciderPluginName", DEFAULT_DECIDER) or DEFAULT_DECIDER
        handler._prefix_plugin = params.str("prefixPluginName", "") or params.str("prefixPluginType", "")
        handler._producer = params.str(PREFIX_MATCH.parameter, "")
        if params.has("threshold"):
            handler._threshold = params.int("threshold", 0, min=0)
        if params.has("hashBlockSize"):
            handler._hash_block_size = params.int("hashBlockSize", 0, min=1)
        return handler

    def resolve_plugins(self, plugins: Mapping[str, Plugin], context: PluginContext) -> None:
        assert self._params is not None
        params = self._params
        if self._prefix_plugin and self._prefix_plugin not in plugins:
            key = "prefixPluginName" if params.has("prefixPluginName") else "prefixPluginType"
            raise params.fail(key, "no plugin of that name is configured")
        p = plugins.get(self._decider_name)
        if p is not None:
            if not isinstance(p, DisaggDecider):
                raise params.fail("deciderPluginName", f"plugin {self._decider_name!r} is not a P/D decider")
            self.prefill_decider = p
            return
        if self._threshold is None:
            raise params.fail(
                "deciderPluginName",
                f"no plugin named {self._decider_name!r} is configured (or set the legacy 'threshold')",
            )
        # The first releases' form: the handler decides by itself on `threshold` uncached tokens.
        producer = self._producer
        if not producer and self._prefix_plugin:
            named = plugins[self._prefix_plugin]
            producer = str(getattr(named, "producer", "")) or named.name
        decider = PrefixBasedPDDecider(f"{self.name}/decider", non_cached_tokens=self._threshold)
        if self._hash_block_size is not None:
            decider._producer_params = {"blockSizeTokens": self._hash_block_size}
        if producer in plugins:
            decider.key = next((k for k in plugins[producer].produces() if k.name.startswith(_MATCH_INFO)), None)
        if decider.key is None:
            decider.resolve_plugins(plugins, context)
        self.prefill_decider = decider

    def _record(self, request: InferenceRequest, results: Mapping[str, ProfileResult | None]) -> None:
        kind = PREFILL_DECODE if self.prefill_profile in results else DECODE_ONLY
        PD_DECISIONS.labels(self.name, self.type_name, model_label(request.target_model), kind).inc()

    def process_results(
        self, state: CycleState, request: InferenceRequest, results: Mapping[str, ProfileResult | None]
    ) -> SchedulingResult:
        decode = results.get(self.decode_profile)
        if self.primary_port and decode is not None and decode.targets:
            upstream_headers(request)[DATA_PARALLEL_HEADER] = decode.targets[0].hostport
            ported = ProfileResult([_with_port(ep, self.primary_port) for ep in decode.targets], scores=decode.scores)
            results = {**results, self.decode_profile: ported}
        return super().process_results(state, request, results)

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        """No stage headers: prefill-header-handler sets them."""

    def admission_endpoints(self, request: InferenceRequest, candidates: Sequence[Endpoint]) -> list[Endpoint]:
        return list(candidates)


def _with_port(ep: Endpoint, port: int) -> Endpoint:
    """The same pod at `port` (its data-parallel rank 0 in front of the ranks)."""
    return Endpoint(
        name=ep.name,
        address=ep.address,
        port=port,
        namespace=ep.namespace,
        labels=ep.labels,
        metrics=ep.metrics,
        metrics_port=ep.metrics_port,
        pod_name=ep.pod_name,
        attributes=ep.attributes,
    )
