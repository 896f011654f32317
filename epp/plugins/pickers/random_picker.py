"""random-picker: `maxNumOfEndpoints` endpoints uniformly at random, ignoring scores (GIE)."""

from __future__ import annotations

from collections.abc import Sequence

from epp.framework import CycleState, Endpoint, InferenceRequest, ProfileResult
from epp.plugins.pickers._common import CountPicker, random_pick


class RandomPicker(CountPicker):
    type_name = "random-picker"

    def pick(
        self, state: CycleState, request: InferenceRequest, scored: Sequence[tuple[Endpoint, float]]
    ) -> ProfileResult:
        return random_pick(scored, self.max_num)
