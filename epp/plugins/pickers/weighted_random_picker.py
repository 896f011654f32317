"""weighted-random-picker: sampling without replacement proportional to score (A-Res, key = U^(1/score); GIE)."""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from epp.framework import CycleState, Endpoint, InferenceRequest, ProfileResult
from epp.plugins.pickers._common import PICKER_RANDOM, CountPicker, random_pick


class WeightedRandomPicker(CountPicker):
    type_name = "weighted-random-picker"

    def pick(
        self, state: CycleState, request: InferenceRequest, scored: Sequence[tuple[Endpoint, float]]
    ) -> ProfileResult:
        if not any(s > 0 for _, s in scored):
            return random_pick(scored, self.max_num)
        rnd = PICKER_RANDOM.random
        keyed = [((rnd() ** (1.0 / s)) if s > 0 else 0.0, i) for i, (_, s) in enumerate(scored)]
        top = heapq.nlargest(min(self.max_num, len(scored)), keyed)
        chosen = [scored[i] for _, i in top]
        return ProfileResult(targets=[ep for ep, _ in chosen], scores={ep.name: s for ep, s in chosen})
