"""disagg-profile-handler (llm-d): decode always, then encode and prefill when their deciders say so.

Decode-first (default): run the decode profile; with its pick, ask `deciders.encode` (E/P/D) and then
`deciders.prefill` (P/D) whether those stages run; the prefill profile's plugins see the decode pick as
PEER_ENDPOINT in the CycleState. Prefill-first (`stageOrder: prefill-first`): prefill (whenever its profile exists),
encode, then decode, which sees the prefill pick. Decode is the primary result; a stage whose profile finds no pod
is dropped (the decode pod prefills locally). PreRequest sets `x-prefiller-host-port` / `x-encoder-hosts-ports`
for the decode pod's sidecar (OVERWRITE; a client's value is removed). The flat parameters of older releases
(`decodeProfile`, `prefillDeciderPluginName`, pd-profile-handler's `deciderPluginName`...) still load, but not
mixed with the nested ones. Admission measures saturation over decode-capable pods only, so a saturated prefill
pool never sheds requests that need no prefill pod.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, Self

from epp.framework import (
    PEER_ENDPOINT,
    CycleState,
    DataKey,
    DisaggDecider,
    Endpoint,
    InferenceRequest,
    Params,
    Plugin,
    PluginContext,
    ProfileResult,
    SchedulingResult,
)
from epp.plugins.contracts.disagg import decode_capable, set_stage_headers
from epp.plugins.profiles._disagg import (
    DISAGG_DECISIONS,
    decision_type,
    model_label,
    record_decision,
)

log = logging.getLogger(__name__)

DECODE_FIRST = "decode-first"
PREFILL_FIRST = "prefill-first"
# Stages whose decider said no in this cycle (so it is asked once).
_SKIPPED = DataKey[set[str]]("disagg-skipped-stages")

_NESTED = ("profiles", "deciders", "stageOrder")
_FLAT = (
    "decodeProfile",
    "prefillProfile",
    "encodeProfile",
    "prefillDeciderPluginName",
    "encodeDeciderPluginName",
    "deciderPluginName",
)


def parse_stage_order(params: Params) -> str:
    raw = params.str("stageOrder", "")
    norm = raw.lower().replace("-", "").replace("_", "")
    if norm in ("", "decodefirst", "decode"):
        return DECODE_FIRST
    if norm in ("prefillfirst", "prefill"):
        return PREFILL_FIRST
    raise params.fail("stageOrder", f"must be {DECODE_FIRST} or {PREFILL_FIRST}")


class DisaggProfileHandler(Plugin):
    type_name = "disagg-profile-handler"

    def __init__(
        self,
        name: str | None = None,
        *,
        decode_profile: str = "decode",
        prefill_profile: str = "prefill",
        encode_profile: str = "encode",
        prefill_decider: DisaggDecider | None = None,
        encode_decider: DisaggDecider | None = None,
        stage_order: str = DECODE_FIRST,
    ) -> None:
        super().__init__(name)
        self.decode_profile = decode_profile
        self.prefill_profile = prefill_profile
        self.encode_profile = encode_profile
        self.prefill_decider = prefill_decider
        self.encode_decider = encode_decider
        self.stage_order = stage_order
        # Decider names from the config, resolved once every plugin exists: (name, params section, key).
        self._refs: dict[str, tuple[str, Params, str]] = {}

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        nested = [k for k in _NESTED if k != "stageOrder" and params.has(k)]
        flat = [k for k in _FLAT if params.has(k)]
        if nested and flat:
            raise params.fail(
                flat[0],
                f"use one format: the nested {'/'.join(nested)} or the deprecated flat parameters, not both",
            )
        order = parse_stage_order(params)
        handler = cls(name, stage_order=order)
        if flat:
            log.warning("%s: flat parameters %s are deprecated; use profiles.* and deciders.*", name, ", ".join(flat))
            handler.decode_profile = params.str("decodeProfile", "") or "decode"
            handler.prefill_profile = params.str("prefillProfile", "") or "prefill"
            handler.encode_profile = params.str("encodeProfile", "") or "encode"
            prefill_key = "prefillDeciderPluginName"
            if not params.str(prefill_key, "") and params.str("deciderPluginName", ""):
                prefill_key = "deciderPluginName"
            for stage, key in (("prefill", prefill_key), ("encode", "encodeDeciderPluginName")):
                ref = params.str(key, "")
                if ref:
                    handler._refs[stage] = (ref, params, key)
            params.get("deciderPluginName")
        else:
            # Unknown keys under profiles/deciders: the builder's unread-parameter errors (file:line), as any other.
            profiles = params.section("profiles")
            handler.decode_profile = profiles.str("decode", "") or "decode"
            handler.prefill_profile = profiles.str("prefill", "") or "prefill"
            handler.encode_profile = profiles.str("encode", "") or "encode"
            deciders = params.section("deciders")
            for stage in ("prefill", "encode"):
                ref = deciders.str(stage, "")
                if ref:
                    handler._refs[stage] = (ref, deciders, stage)
        if order == PREFILL_FIRST and "prefill" in handler._refs:
            _, where, key = handler._refs["prefill"]
            raise where.fail(key, f"a prefill decider is not supported with stageOrder {PREFILL_FIRST}")
        return handler

    def resolve_plugins(self, plugins: Mapping[str, Plugin], context: PluginContext) -> None:
        for stage, (ref, where, key) in self._refs.items():
            p = plugins.get(ref)
            if p is None:
                raise where.fail(key, "no plugin of that name is configured")
            if not isinstance(p, DisaggDecider):
                raise where.fail(key, f"plugin {ref!r} ({p.type_name}) is not a disaggregation decider")
            if stage == "prefill":
                self.prefill_decider = p
            else:
                self.encode_decider = p
        for stage in ("prefill", "encode"):
            if stage not in self._refs:
                log.info("%s: no deciders.%s configured: %s disaggregation disabled", self.name, stage, stage)

    # -- ProfileHandler --------------------------------------------------------------------------------------

    def pick_profiles(
        self,
        state: CycleState,
        request: InferenceRequest,
        profiles: Mapping[str, Any],
        results: Mapping[str, ProfileResult | None],
    ) -> list[str]:
        if self.stage_order == PREFILL_FIRST:
            return self._prefill_first(state, request, profiles, results)
        return self._decode_first(state, request, profiles, results)

    def _skipped(self, state: CycleState) -> set[str]:
        skipped = state.get(_SKIPPED)
        if skipped is None:
            skipped = set()
            state.put(_SKIPPED, skipped)
        return skipped

    def _wants(
        self,
        stage: str,
        decider: DisaggDecider | None,
        state: CycleState,
        request: InferenceRequest,
        profiles: Mapping[str, Any],
        results: Mapping[str, ProfileResult | None],
        peer: Endpoint | None,
    ) -> bool:
        """Whether `stage` (a profile name) should run now: configured, not yet run or declined, decider yes."""
        if stage not in profiles or stage in results:
            return False
        skipped = self._skipped(state)
        if stage in skipped:
            return False
        if decider is not None and decider.disaggregate(state, request, peer):
            return True
        skipped.add(stage)
        return False

    def _decode_first(
        self,
        state: CycleState,
        request: InferenceRequest,
        profiles: Mapping[str, Any],
        results: Mapping[str, ProfileResult | None],
    ) -> list[str]:
        if self.decode_profile not in results:
            return [self.decode_profile] if self.decode_profile in profiles else []
        decode = results[self.decode_profile]
        if decode is None or not decode.targets:
            return []
        peer = decode.targets[0]
        if self._wants(self.encode_profile, self.encode_decider, state, request, profiles, results, peer):
            return [self.encode_profile]
        if self._wants(self.prefill_profile, self.prefill_decider, state, request, profiles, results, peer):
            state.put(PEER_ENDPOINT, peer)
            return [self.prefill_profile]
        self._record(request, results)
        return []

    def _prefill_first(
        self,
        state: CycleState,
        request: InferenceRequest,
        profiles: Mapping[str, Any],
        results: Mapping[str, ProfileResult | None],
    ) -> list[str]:
        if self.decode_profile in results:
            decode = results[self.decode_profile]
            if decode is not None and decode.targets:
                self._record(request, results)
            return []
        if self.prefill_profile in profiles and self.prefill_profile not in results:
            return [self.prefill_profile]
        if self._wants(self.encode_profile, self.encode_decider, state, request, profiles, results, None):
            return [self.encode_profile]
        if self.decode_profile not in profiles:
            return []
        prefill = results.get(self.prefill_profile)
        if prefill is not None and prefill.targets:
            state.put(PEER_ENDPOINT, prefill.targets[0])
        return [self.decode_profile]

    def _record(self, request: InferenceRequest, results: Mapping[str, ProfileResult | None]) -> None:
        encode, prefill = results.get(self.encode_profile), results.get(self.prefill_profile)
        kind = decision_type(encode is not None and bool(encode.targets), prefill is not None and bool(prefill.targets))
        DISAGG_DECISIONS.labels(self.name, self.type_name, model_label(request.target_model), kind).inc()

    def process_results(
        self, state: CycleState, request: InferenceRequest, results: Mapping[str, ProfileResult | None]
    ) -> SchedulingResult:
        decode = results.get(self.decode_profile)
        if decode is None or not decode.targets:
            # No decode pod: the scheduler fails the request ("no endpoints available").
            return SchedulingResult(profile_results={}, primary_profile=self.decode_profile)
        out: dict[str, ProfileResult] = {self.decode_profile: decode}
        for stage in (self.prefill_profile, self.encode_profile):
            r = results.get(stage)
            if r is not None and r.targets:
                out[stage] = r
            elif stage in results and log.isEnabledFor(logging.DEBUG):
                log.debug("request %s: stage %s found no pod; decode-only for it", request.request_id, stage)
        result = SchedulingResult(profile_results=out, primary_profile=self.decode_profile)
        record_decision(request, result, self.prefill_profile, self.encode_profile)
        return result

    # -- PreRequest ------------------------------------------------------------------------------------------

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        set_stage_headers(request, result, self.prefill_profile, self.encode_profile)

    # -- AdmissionScope --------------------------------------------------------------------------------------

    def admission_endpoints(self, request: InferenceRequest, candidates: Sequence[Endpoint]) -> list[Endpoint]:
        return decode_capable(candidates)
