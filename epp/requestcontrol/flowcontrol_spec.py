"""The flow-control settings (EndpointPickerConfig `flowControl`), as the config loader fills them in."""

from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_PRIORITY_BAND_MAX_BYTES = 1_000_000_000


@dataclass(slots=True)
class PriorityBandSpec:
    priority: int
    name: str = ""
    max_bytes: int = DEFAULT_PRIORITY_BAND_MAX_BYTES
    max_requests: int | None = None
    fairness_policy_ref: str | None = None
    ordering_policy_ref: str | None = None


@dataclass(slots=True)
class FlowControlSpec:
    max_bytes: int | None = None
    max_requests: int | None = None
    default_request_ttl: float | None = None
    default_priority_band: PriorityBandSpec | None = None
    priority_bands: list[PriorityBandSpec] = field(default_factory=list)
    usage_limit_policy_ref: str | None = None
    # llm-d-router v0.10: `noEndpointRequestTTL` (how long a request waits for an endpoint to appear),
    # `defaultNegativePriorityBand` (the template for undeclared priorities < 0), `enableEviction`
    # (sheddable in-flight requests may be evicted for higher priorities) and the saturation detector's name.
    no_endpoint_request_ttl: float | None = None
    default_negative_priority_band: PriorityBandSpec | None = None
    enable_eviction: bool = False
    saturation_detector_ref: str | None = None
