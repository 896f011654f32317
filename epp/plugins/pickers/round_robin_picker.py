"""round-robin-picker: rotate over the candidates (sorted by name), ignoring scores.

The behaviour of GIE's lightweight reference EPP (lwepp); useful as a baseline strategy and for
protocol tests that need a deterministic spread over backends.
"""

from __future__ import annotations

from collections.abc import Sequence

from epp.framework import CycleState, Endpoint, InferenceRequest, ProfileResult
from epp.plugins.pickers._common import CountPicker


class RoundRobinPicker(CountPicker):
    type_name = "round-robin-picker"

    def __init__(self, name: str | None = None, max_num: int = 1) -> None:
        super().__init__(name, max_num)
        self._next = 0

    def pick(
        self, state: CycleState, request: InferenceRequest, scored: Sequence[tuple[Endpoint, float]]
    ) -> ProfileResult:
        ordered = sorted(scored, key=lambda es: es[0].name)
        if not ordered:
            return ProfileResult(targets=[])
        start = self._next % len(ordered)
        self._next += 1
        chosen = [ordered[(start + i) % len(ordered)] for i in range(min(self.max_num, len(ordered)))]
        return ProfileResult(targets=[ep for ep, _ in chosen], scores={ep.name: s for ep, s in chosen})
