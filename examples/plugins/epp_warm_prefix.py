"""warm-prefix-scorer: an example pyepp plugin that reads another plugin's data. 1.0 for the endpoints that cache at
least `minShare` of the prompt, as a prefix producer matched it, and 0 for the others."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any, Self

from epp.framework import CycleState, DataKey, Endpoint, InferenceRequest, Params, Plugin, PluginContext
from epp.plugins.contracts.prefix import PREFIX_MATCH


class WarmPrefixScorer(Plugin):
    type_name = "warm-prefix-scorer"

    def __init__(self, name: str | None = None, producer: str = PREFIX_MATCH.default, min_share: float = 0.5) -> None:
        super().__init__(name)
        self.key = PREFIX_MATCH.of(producer)
        self.min_share = min_share

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        # The producer `prefixMatchInfoProducerName` names, else approx-prefix-cache-producer (added when missing).
        producer = context.producer_for(PREFIX_MATCH, params, requested_by=name)
        return cls(name, producer, params.float("minShare", 0.5, min=0.0, max=1.0))

    def consumes(self) -> Collection[DataKey[Any]]:
        return (self.key,)  # the builder runs the producer first, and refuses a config without it

    def score(self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[float]:
        info = request.data.get(self.key)
        if info is None or info.total_blocks <= 0:
            return [0.0] * len(endpoints)
        return [float(info.matches.get(ep.name, 0) >= self.min_share * info.total_blocks) for ep in endpoints]
