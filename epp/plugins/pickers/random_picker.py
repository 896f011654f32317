"""random-picker: `maxNumOfEndpoints` endpoints uniformly at random, ignoring scores (GIE)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Self

from epp.framework import CycleState, Endpoint, InferenceRequest, Params, Plugin, PluginContext, ProfileResult
from epp.plugins.pickers._common import max_endpoints, random_pick


class RandomPicker(Plugin):
    type_name = "random-picker"

    def __init__(self, name: str | None = None, max_num: int = 1) -> None:
        super().__init__(name)
        self.max_num = max_num

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        return cls(name, max_endpoints(params))

    def pick(
        self, state: CycleState, request: InferenceRequest, scored: Sequence[tuple[Endpoint, float]]
    ) -> ProfileResult:
        return random_pick(scored, self.max_num)
