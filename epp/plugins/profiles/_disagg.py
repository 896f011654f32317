"""What the disaggregation profile handlers share: the decision metrics and the decision the PreRequest plugins
read (the stage headers and decode-capable pods are in `epp.plugins.contracts.disagg`)."""

from __future__ import annotations

from prometheus_client import Counter

from epp.framework import (
    DISAGG_DECISION,
    DisaggDecision,
    InferenceRequest,
    SchedulingResult,
)

DECODE_ONLY = "decode-only"
PREFILL_DECODE = "prefill-decode"
ENCODE_DECODE = "encode-decode"
ENCODE_PREFILL_DECODE = "encode-prefill-decode"

DISAGG_DECISIONS = Counter(
    "llm_d_epp_disagg_decision_total",
    "Total number of disaggregation routing decisions made",
    ["plugin_name", "plugin_type", "model_name", "decision_type"],
)
PD_DECISIONS = Counter(
    "llm_d_epp_pd_decision_total",
    "Total number of P/D disaggregation decisions made (pd-profile-handler)",
    ["plugin_name", "plugin_type", "model_name", "decision_type"],
)

# Model names come from clients: at most this many distinct label values, the rest count as "other".
_MAX_MODELS = 64
_models: set[str] = set()


def model_label(model: str) -> str:
    if not model:
        return "unknown"
    if model in _models:
        return model
    if len(_models) >= _MAX_MODELS:
        return "other"
    _models.add(model)
    return model


def decision_type(encode_used: bool, prefill_used: bool) -> str:
    if encode_used and prefill_used:
        return ENCODE_PREFILL_DECODE
    if encode_used:
        return ENCODE_DECODE
    return PREFILL_DECODE if prefill_used else DECODE_ONLY


def record_decision(
    request: InferenceRequest, result: SchedulingResult, prefill_profile: str, encode_profile: str
) -> None:
    """Publish the stages' pods (DISAGG_DECISION) for PreRequest plugins: headers, speculative index entries."""
    targets = result.targets
    if not targets:
        return
    prefill = result.profile_results.get(prefill_profile)
    encode = result.profile_results.get(encode_profile)
    request.data.put(
        DISAGG_DECISION,
        DisaggDecision(
            decode=targets[0],
            prefill=prefill.targets[0] if prefill is not None and prefill.targets else None,
            encode=list(encode.targets) if encode is not None else [],
            prefill_profile=prefill_profile,
            encode_profile=encode_profile,
        ),
    )
