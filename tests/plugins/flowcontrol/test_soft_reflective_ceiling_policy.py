"""soft-reflective-ceiling-policy: gated bands alternate."""

from __future__ import annotations

from epp.plugins.flowcontrol.soft_reflective_ceiling_policy import SoftReflectiveCeilingPolicy


def test_soft_reflective_ceiling_alternates_gated_bands() -> None:
    p = SoftReflectiveCeilingPolicy()
    # 3 bands at saturation 0.3: band 1 ceiling 0.85 (open), band 2 ceiling 0.7 (open)
    assert p.ceilings(0.3, [2, 1, 0]) == [1.0, float("inf"), float("inf")]
    # saturation 0.75: band 1 ceiling 0.625 and band 2 0.25 are gated; period round(0.75/0.25) = 3
    opens = [p.ceilings(0.75, [2, 1, 0])[2] == float("inf") for _ in range(9)]
    assert opens.count(True) == 3 and opens[0] is True
    assert p.ceilings(1.0, [1, 0]) == [1.0, 0.0]
    assert p.ceilings(0.9, [0]) == [1.0]
