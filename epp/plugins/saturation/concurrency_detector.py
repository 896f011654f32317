"""concurrency-detector (llm-d): saturation from the in-flight load the EPP itself counts (inflight-load-producer),
reacting at once instead of waiting for the next metrics scrape; also a filter.

Saturation: `requests` mode Σ in-flight requests / (endpoints · maxConcurrency); `tokens` mode Σ in-flight tokens /
(endpoints · maxTokenConcurrency); `hybrid` the mean over endpoints of max(requests/maxConcurrency,
tokens/maxTokenConcurrency). No endpoints is 1.0. As a filter it drops endpoints at or above limit · (1 + headroom)
in the mode's dimension(s) (both in hybrid); like llm-d's it does not fail open.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any, Self

from epp.framework import (
    INFLIGHT_LOAD,
    CycleState,
    DataKey,
    Endpoint,
    InferenceRequest,
    InFlightLoad,
    Params,
    Plugin,
    PluginContext,
)
from epp.plugins.contracts.load import INFLIGHT, INFLIGHT_PRODUCER

MODES = ("requests", "tokens", "hybrid")
_ZERO = InFlightLoad()


class ConcurrencyDetector(Plugin):
    type_name = "concurrency-detector"
    live_saturation = True  # the in-flight counts drop as a stream ends

    def __init__(
        self,
        name: str | None = None,
        *,
        mode: str = "requests",
        max_concurrency: int = 100,
        max_token_concurrency: int = 1000000,
        headroom: float = 0.0,
        producer: str = INFLIGHT_PRODUCER,
    ) -> None:
        super().__init__(name)
        self.mode = mode
        self.max_requests = max_concurrency
        self.max_tokens = max_token_concurrency
        self.headroom = headroom
        self.key = INFLIGHT_LOAD.of(producer)

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        return cls(
            name,
            mode=params.str("concurrencyMode", "requests", choices=MODES),
            max_concurrency=params.int("maxConcurrency", 100, min=1),
            max_token_concurrency=params.int("maxTokenConcurrency", 1000000, min=1),
            headroom=params.float("headroom", 0.0, min=0.0),
            producer=context.producer_for(INFLIGHT, params, requested_by=name),
        )

    def consumes(self) -> Collection[DataKey[Any]]:
        return (self.key,)

    def _load(self, ep: Endpoint) -> InFlightLoad:
        return ep.attributes.get(self.key) or _ZERO

    def saturation(self, endpoints: Sequence[Endpoint]) -> float:
        if not endpoints:
            return 1.0
        mr, mt = self.max_requests, self.max_tokens
        reqs = toks = 0
        hybrid = 0.0
        for ep in endpoints:
            load = self._load(ep)
            r, t = load.total_requests, load.total_tokens
            reqs += r
            toks += t
            hybrid += max(r / mr, t / mt)
        n = len(endpoints)
        if self.mode == "tokens":
            return toks / (n * mt)
        if self.mode == "hybrid":
            return hybrid / n
        return reqs / (n * mr)

    def filter(self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[Endpoint]:
        factor = 1.0 + self.headroom
        req_limit = int(self.max_requests * factor)
        tok_limit = int(self.max_tokens * factor)
        mode = self.mode
        kept = []
        for ep in endpoints:
            load = self._load(ep)
            if mode == "tokens":
                ok = load.total_tokens < tok_limit
            elif mode == "hybrid":
                ok = load.total_requests < req_limit and load.total_tokens < tok_limit
            else:
                ok = load.total_requests < req_limit
            if ok:
                kept.append(ep)
        return kept
