"""pd-profile-handler (llm-d, deprecated since v0.7: use disagg-profile-handler): decode, then prefill when the
decider says so. Pair it with prefill-header-handler, which sets `x-prefiller-host-port` (this handler sets none).

Parameters as in llm-d: `decodeProfile`, `prefillProfile`, `deciderPluginName` (default
prefix-based-pd-decider), `prefixPluginName`/`prefixPluginType` and `prefixMatchInfoProducerName` (which prefix
producer the built-in threshold decider reads), `primaryPort` (decode targets get this port; the chosen pod's
`ip:port` goes to `x-data-parallel-host-port`). The first releases' `threshold` (uncached tokens) and
`hashBlockSize` still load: without a plugin named `deciderPluginName`, `threshold` builds the handler's own
prefix-based decider (`nonCachedTokens: threshold`), and `hashBlockSize` is the block size of the
approx-prefix-cache-producer added for it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Self

from epp.framework import (
    DATA_PARALLEL_HEADER,
    PREFIX_CACHE_MATCH_INFO,
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
from epp.plugins.deciders.prefix_based_pd_decider import PrefixBasedPDDecider
from epp.plugins.profiles._disagg import (
    DECODE_ONLY,
    PD_DECISIONS,
    PREFILL_DECODE,
    model_label,
    record_decision,
    upstream_headers,
)

log = logging.getLogger(__name__)

DEFAULT_DECIDER = "prefix-based-pd-decider"
_MATCH_INFO = PREFIX_CACHE_MATCH_INFO.name + "/"


class PdProfileHandler(Plugin):
    type_name = "pd-profile-handler"

    def __init__(
        self,
        name: str | None = None,
        *,
        decode_profile: str = "decode",
        prefill_profile: str = "prefill",
        decider: DisaggDecider | None = None,
        primary_port: int = 0,
    ) -> None:
        super().__init__(name)
        self.decode_profile = decode_profile
        self.prefill_profile = prefill_profile
        self.decider = decider
        self.primary_port = primary_port
        self._params: Params | None = None
        self._decider_name = DEFAULT_DECIDER
        self._prefix_plugin = ""
        self._producer = ""
        self._threshold: int | None = None
        self._hash_block_size: int | None = None

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
        handler._producer = params.str("prefixMatchInfoProducerName", "")
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
            self.decider = p
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
        self.decider = decider

    def pick_profiles(
        self,
        state: CycleState,
        request: InferenceRequest,
        profiles: Mapping[str, Any],
        results: Mapping[str, ProfileResult | None],
    ) -> list[str]:
        if self.decode_profile not in results:
            return [self.decode_profile] if self.decode_profile in profiles else []
        decode = results[self.decode_profile]
        if len(profiles) == len(results) or decode is None or not decode.targets:
            return []
        model = model_label(request.target_model)
        if self.decider is not None and self.decider.disaggregate(state, request, decode.targets[0]):
            PD_DECISIONS.labels(self.name, self.type_name, model, PREFILL_DECODE).inc()
            return [self.prefill_profile] if self.prefill_profile in profiles else []
        PD_DECISIONS.labels(self.name, self.type_name, model, DECODE_ONLY).inc()
        return []

    def process_results(
        self, state: CycleState, request: InferenceRequest, results: Mapping[str, ProfileResult | None]
    ) -> SchedulingResult:
        decode = results.get(self.decode_profile)
        if decode is None or not decode.targets:
            return SchedulingResult(profile_results={}, primary_profile=self.decode_profile)
        if self.primary_port:
            chosen = decode.targets[0]
            upstream_headers(request)[DATA_PARALLEL_HEADER] = chosen.hostport
            decode = ProfileResult(
                targets=[_with_port(ep, self.primary_port) for ep in decode.targets], scores=decode.scores
            )
        out = {self.decode_profile: decode}
        prefill = results.get(self.prefill_profile)
        if prefill is not None and prefill.targets:
            out[self.prefill_profile] = prefill
        result = SchedulingResult(profile_results=out, primary_profile=self.decode_profile)
        record_decision(request, result, self.prefill_profile, "")
        return result


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
