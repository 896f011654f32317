"""What the disaggregation profile handlers and the headers handlers share: decision metrics, the headers the
decode-side sidecar reads, and the decode-capable pods admission measures."""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import Counter

from epp.framework import (
    DISAGG_DECISION,
    ENCODER_HEADER,
    PREFILL_HEADER,
    UPSTREAM_HEADERS,
    DisaggDecision,
    Endpoint,
    InferenceRequest,
    SchedulingResult,
)
from epp.plugins.filters._role import ROLE_LABEL
from epp.plugins.filters.decode_filter import DecodeFilter

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


def upstream_headers(request: InferenceRequest) -> dict[str, str]:
    """The request's UPSTREAM_HEADERS, created on first use."""
    headers = request.data.get(UPSTREAM_HEADERS)
    if headers is None:
        headers = {}
        request.data.put(UPSTREAM_HEADERS, headers)
    return headers


def set_stage_headers(
    request: InferenceRequest, result: SchedulingResult, prefill_profile: str, encode_profile: str
) -> None:
    """x-prefiller-host-port / x-encoder-hosts-ports from the prefill and encode picks; a stage that did not run
    sends no header (and the server drops a client's)."""
    headers = upstream_headers(request)
    headers.pop(PREFILL_HEADER, None)
    headers.pop(ENCODER_HEADER, None)
    prefill = result.profile_results.get(prefill_profile)
    if prefill is not None and prefill.targets:
        headers[PREFILL_HEADER] = prefill.targets[0].hostport
    encode = result.profile_results.get(encode_profile)
    if encode is not None and encode.targets:
        headers[ENCODER_HEADER] = ",".join(ep.hostport for ep in encode.targets)


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


def decode_capable(endpoints: Sequence[Endpoint]) -> list[Endpoint]:
    """Pods that can serve the decode stage (decode-filter's rule: a decode role or no role label)."""
    roles = DecodeFilter.roles
    return [ep for ep in endpoints if (r := ep.labels.get(ROLE_LABEL)) is None or r in roles]
