"""no-hit-lru-scorer (llm-d): spread cold requests (no prefix hit anywhere) over the least recently used endpoints.

Any hit → 0.5 everywhere (leave the choice to the prefix scorer). Cold → never-used endpoints first
(1 - i/(N-1)), then used ones from least to most recently used (1 - (neverUsed + lruPos)/(N-1)).
The LRU is updated in PreRequest, for cold requests only.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Sequence
from typing import Any, Self

from epp.framework import (
    PREFIX_CACHE_MATCH_INFO,
    CycleState,
    DataKey,
    Endpoint,
    InferenceRequest,
    Params,
    Plugin,
    PluginContext,
    SchedulingResult,
)
from epp.plugins.contracts.prefix import APPROX_PRODUCER, PREFIX_MATCH

# Set by score() for PreRequest: whether the request hit no endpoint's cache (one key per scorer instance).
COLD = DataKey[bool]("no-hit-lru-cold")


class NoHitLRUScorer(Plugin):
    type_name = "no-hit-lru-scorer"
    records_only = True  # PreRequest writes only the LRU of cold picks: may run after the answer

    def __init__(self, name: str | None = None, lru_size: int = 1024, producer: str = APPROX_PRODUCER) -> None:
        super().__init__(name)
        self.lru_size = lru_size
        self.key = PREFIX_CACHE_MATCH_INFO.of(producer)
        self._cold = COLD.of(self.name)
        self._lru: OrderedDict[str, None] = OrderedDict()  # least recently used first

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        producer = context.producer_for(PREFIX_MATCH, params, requested_by=name)
        return cls(name, lru_size=params.int("lruSize", 1024, min=1), producer=producer)

    def consumes(self) -> Collection[DataKey[Any]]:
        return (self.key,)

    def _is_cold(self, request: InferenceRequest) -> bool:
        info = request.data.get(self.key)
        return info is None or not any(v > 0 for v in info.matches.values())

    def score(self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[float]:
        cold = self._is_cold(request)
        request.data.put(self._cold, cold)
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
        if not targets or not request.data.get(self._cold):
            return
        name = targets[0].name
        self._lru[name] = None
        self._lru.move_to_end(name)
        while len(self._lru) > self.lru_size:
            self._lru.popitem(last=False)
