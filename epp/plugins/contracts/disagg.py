"""Disaggregated serving shared across plugin folders: the role label the role filters and the P/D handlers read,
and the headers the decode pod's routing sidecar reads (profile handlers, pre-request handlers, producers)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from epp.framework import ENCODER_HEADER, PREFILL_HEADER, UPSTREAM_HEADERS, Endpoint, InferenceRequest, SchedulingResult

ROLE_LABEL: Final = "llm-d.ai/role"
# The roles decode-filter keeps (besides pods without a role label).
DECODE_ROLES: Final = frozenset({"decode", "prefill-decode", "both", "encode-prefill-decode"})


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


def decode_capable(endpoints: Sequence[Endpoint]) -> list[Endpoint]:
    """Pods that can serve the decode stage (decode-filter's rule: a decode role or no role label)."""
    return [ep for ep in endpoints if (r := ep.labels.get(ROLE_LABEL)) is None or r in DECODE_ROLES]
