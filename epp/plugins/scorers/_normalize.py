"""Score normalization shared by the load scorers."""

from __future__ import annotations

from collections.abc import Sequence


def min_max_inverted(values: Sequence[float]) -> list[float]:
    """(max - v) / (max - min); every candidate gets 1.0 when all values are equal."""
    if not values:
        return []
    lo, hi = min(values), max(values)
    if hi == lo:
        return [1.0] * len(values)
    span = hi - lo
    return [(hi - v) / span for v in values]
