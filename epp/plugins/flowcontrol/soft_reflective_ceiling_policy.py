"""soft-reflective-ceiling-policy (flow control usage limit): band i of N (0 = highest) has the reflective ceiling
1 - i·saturation/(N-1). Below it the band is open; at or past it (saturation < 1) the band opens on one call in
round(saturation/(1-saturation)), on one tick shared by every gated band, so the gated dispatch rate falls
continuously with saturation; at saturation >= 1 every band is held. No parameters.
"""

from __future__ import annotations

from epp.framework import Plugin, Stability

OPEN, CLOSED = float("inf"), 0.0


class SoftReflectiveCeilingPolicy(Plugin):
    type_name = "soft-reflective-ceiling-policy"
    stability = Stability.ALPHA
    threshold = 1.0

    def __init__(self, name: str | None = None) -> None:
        super().__init__(name)
        self._tick = 0

    def ceilings(self, saturation: float, priorities: list[int]) -> list[float]:
        """Per band: OPEN (never gates), CLOSED (always gates) or 1.0 for band 0 (gates at saturation >= 1)."""
        n = len(priorities)
        if n == 0:
            return []
        out = [1.0]
        if n == 1:
            return out
        gated_open: bool | None = None
        for i in range(1, n):
            ceiling = 1.0 - i * saturation / (n - 1)
            if saturation < ceiling:
                out.append(OPEN)
                continue
            if saturation >= 1.0:
                out.append(CLOSED)
                continue
            if gated_open is None:  # one shared tick per call for every gated band
                period = max(1, round(saturation / (1.0 - saturation)))
                gated_open = self._tick % period == 0
                self._tick += 1
            out.append(OPEN if gated_open else CLOSED)
        return out
