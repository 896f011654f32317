"""max-score-picker: the top `maxNumOfEndpoints` by total score, ties broken at random (GIE)."""

from __future__ import annotations

from collections.abc import Sequence
from operator import itemgetter
from typing import Any

from epp.framework import CycleState, Endpoint, InferenceRequest, Params, Plugin, ProfileResult, register
from plugins._pickers import PICKER_RANDOM, max_endpoints

_SCORE = itemgetter(1)


@register("max-score-picker")
class MaxScorePicker(Plugin):
    def __init__(self, name: str | None = None, max_num: int = 1) -> None:
        super().__init__(name)
        self.max_num = max_num

    @classmethod
    def from_config(cls, name: str, parameters: dict[str, Any], context: Any) -> MaxScorePicker:
        return cls(name, max_endpoints(Params(name, parameters)))

    def pick(
        self, state: CycleState, request: InferenceRequest, scored: Sequence[tuple[Endpoint, float]]
    ) -> ProfileResult:
        if not scored:
            return ProfileResult(targets=[])
        rnd = PICKER_RANDOM
        if self.max_num == 1:
            # Same distribution as GIE's shuffle + stable sort, without shuffling every candidate.
            best = max(scored, key=_SCORE)[1]
            ties = [ep for ep, s in scored if s == best]
            chosen = ties[0] if len(ties) == 1 else ties[rnd.randrange(len(ties))]
            return ProfileResult(targets=[chosen], scores={chosen.name: best})
        ranked = sorted(scored, key=_SCORE, reverse=True)
        out: list[tuple[Endpoint, float]] = []
        i, n = 0, len(ranked)
        while len(out) < self.max_num and i < n:
            j, s = i, ranked[i][1]
            while j < n and ranked[j][1] == s:
                j += 1
            run = ranked[i:j]
            want = min(len(run), self.max_num - len(out))
            out.extend(run if len(run) == 1 else rnd.sample(run, want))
            i = j
        return ProfileResult(targets=[ep for ep, _ in out], scores={ep.name: s for ep, s in out})
