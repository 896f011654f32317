"""The built plugin graph request control runs (assembled from the config by epp.wiring.builder)."""

from __future__ import annotations

from dataclasses import dataclass, field

from epp.framework import (
    Admitter,
    DataProducer,
    Plugin,
    PreRequest,
    RequestHeaderProcessor,
    ResponseComplete,
    ResponseReceived,
    ResponseStreaming,
    SaturationDetector,
    Screener,
)
from epp.framework.parsing import ParserRegistry
from epp.scheduling import Scheduler


@dataclass
class Pipeline:
    plugins: dict[str, Plugin]
    scheduler: Scheduler
    saturation_detector: SaturationDetector
    # In dependency order: a producer runs after the producers of the keys it consumes.
    producers: list[DataProducer] = field(default_factory=list)
    pre_request: list[PreRequest] = field(default_factory=list)
    response_received: list[ResponseReceived] = field(default_factory=list)
    response_complete: list[ResponseComplete] = field(default_factory=list)
    # Run after the producers, before scheduling (e.g. latency-slo-admitter).
    admitters: list[Admitter] = field(default_factory=list)
    response_streaming: list[ResponseStreaming] = field(default_factory=list)
    # requestHandler.parsers (or GIE's `parser`), in config order: the request parsers the server is to use.
    parsers: list[Plugin] = field(default_factory=list)
    # The parser per request path (the router's ParserRegistry over `parsers`, or its default list)
    parser_registry: ParserRegistry = field(default_factory=lambda: ParserRegistry([]))
    # Run first, before admission (agent-identity).
    header_processors: list[RequestHeaderProcessor] = field(default_factory=list)
    # Narrow the candidates once per request, for admission and every profile (disaggregatedset-rollout-screener).
    screeners: list[Screener] = field(default_factory=list)
