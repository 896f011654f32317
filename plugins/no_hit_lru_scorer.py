"""no-hit-lru-scorer (llm-d): spread cold requests (no prefix hit anywhere) over the least recently used endpoints.

Any hit → 0.5 everywhere (leave the choice to the prefix scorer). Cold → never-used endpoints first
(1 - i/(N-1)), then used ones from least to most recently used (1 - (neverUsed + lruPos)/(N-1)).
The LRU is updated in PreRequest, for cold requests only.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from epp.framework import (
    CycleState,
    Endpoint,
    InferenceRequest,
    Params,
    Plugin,
    PrefixCacheMatchInfo,
    SchedulingResult,
    prefix_match_key,
    register,
)

DEFAULT_PRODUCER = "approx-prefix-cache-producer"
_COLD = "no-hit-lru/cold"


@register("no-hit-lru-scorer")
class NoHitLRUScorer(Plugin):
    def __init__(self, name: str | None = None, lru_size: int = 1024, producer: str = DEFAULT_PRODUCER) -> None:
        super().__init__(name)
        self.lru_size = lru_size
        self.key = prefix_match_key(producer)
        self._lru: OrderedDict[str, None] = OrderedDict()  # least recently used first

    @classmethod
    def from_config(cls, name: str, parameters: dict[str, Any], context: Any) -> NoHitLRUScorer:
        p = Params(name, parameters)
        producer = p.str("prefixMatchInfoProducerName", "")
        if not producer:
            producer = DEFAULT_PRODUCER
            if context is not None:
                context.require_plugin(DEFAULT_PRODUCER, DEFAULT_PRODUCER)
        return cls(name, lru_size=p.int("lruSize", 1024, min=1), producer=producer)

    def _is_cold(self, request: InferenceRequest) -> bool:
        info: PrefixCacheMatchInfo | None = request.data.get(self.key)
        return info is None or not any(v > 0 for v in info.matches.values())

    def score(self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[float]:
        cold = self._is_cold(request)
        request.data[_COLD] = cold
        n = len(endpoints)
        if not cold:
            return [0.5] * n
        if n == 1:
            return [1.0]
        lru = self._lru
        rank: dict[str, int] = {}
        never = [ep.name for ep in endpoints if ep.name not in lru]
        for i, name in enumerate(never):
            rank[name] = i
        names = {ep.name for ep in endpoints}
        pos = len(never)
        for name in lru:  # least recently used first
            if name in names:
                rank[name] = pos
                pos += 1
        denom = n - 1
        return [1.0 - rank[ep.name] / denom for ep in endpoints]

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        targets = result.targets
        if not targets or not request.data.get(_COLD, False):
            return
        name = targets[0].name
        self._lru[name] = None
        self._lru.move_to_end(name)
        while len(self._lru) > self.lru_size:
            self._lru.popitem(last=False)
