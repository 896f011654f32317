"""max-score-picker: the top `maxNumOfEndpoints` by total score (GIE).

Ties: `tieBreak: roundRobin` (default) rotates through the tied endpoints; `random` is GIE's shuffle. Rotation
spreads a burst that arrives between two metric scrapes (when every idle pod scores the same) exactly evenly,
where random choice piles some of it onto one pod.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import itemgetter
from typing import Self

from epp.framework import CycleState, Endpoint, InferenceRequest, Params, Plugin, PluginContext, ProfileResult
from epp.plugins.pickers._common import PICKER_RANDOM, max_endpoints

_SCORE = itemgetter(1)


class MaxScorePicker(Plugin):
    type_name = "max-score-picker"

    def __init__(self, name: str | None = None, max_num: int = 1, tie_break: str = "roundRobin") -> None:
        super().__init__(name)
        self.max_num = max_num
        self.random_ties = tie_break == "random"
        self._turn = 0

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        tie_break = params.str("tieBreak", "roundRobin", choices=("roundRobin", "random"))
        return cls(name, max_endpoints(params), tie_break)

    def _tie(self, n: int) -> int:
        """Index of the tied endpoint to prefer."""
        if self.random_ties:
            return PICKER_RANDOM.randrange(n)
        self._turn += 1
        return self._turn % n

    def pick(
        self, state: CycleState, request: InferenceRequest, scored: Sequence[tuple[Endpoint, float]]
    ) -> ProfileResult:
        if not scored:
            return ProfileResult(targets=[])
        if self.max_num == 1:
            best = max(scored, key=_SCORE)[1]
            ties = [ep for ep, s in scored if s == best]
            chosen = ties[0] if len(ties) == 1 else ties[self._tie(len(ties))]
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
            if len(run) > 1:
                if self.random_ties:
                    run = PICKER_RANDOM.sample(run, want)
                else:
                    k = self._tie(len(run))
                    run = run[k:] + run[:k]
            out.extend(run[:want])
            i = j
        return ProfileResult(targets=[ep for ep, _ in out], scores={ep.name: s for ep, s in out})
