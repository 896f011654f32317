"""random-picker: `maxNumOfEndpoints` endpoints uniformly at random, ignoring scores (GIE)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from epp.framework import CycleState, Endpoint, InferenceRequest, Params, Plugin, ProfileResult, register
from plugins._pickers import PICKER_RANDOM, max_endpoints


def random_pick(scored: Sequence[tuple[Endpoint, float]], n: int) -> ProfileResult:
    chosen = PICKER_RANDOM.sample(list(scored), min(n, len(scored)))
    return ProfileResult(targets=[ep for ep, _ in chosen], scores={ep.name: s for ep, s in chosen})


@register("random-picker")
class RandomPicker(Plugin):
    def __init__(self, name: str | None = None, max_num: int = 1) -> None:
        super().__init__(name)
        self.max_num = max_num

    @classmethod
    def from_config(cls, name: str, parameters: dict[str, Any], context: Any) -> RandomPicker:
        return cls(name, max_endpoints(Params(name, parameters)))

    def pick(
        self, state: CycleState, request: InferenceRequest, scored: Sequence[tuple[Endpoint, float]]
    ) -> ProfileResult:
        return random_pick(scored, self.max_num)
