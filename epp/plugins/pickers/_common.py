"""What the pickers share: the `maxNumOfEndpoints` parameter (≤0 falls back to 1, like GIE) and one generator."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Self

from epp.framework import Endpoint, Params, Plugin, PluginContext, ProfileResult

# One generator for all pickers (GIE shares a PickerRand); seedable in tests.
PICKER_RANDOM = random.Random()


def max_endpoints(p: Params) -> int:
    n = p.int("maxNumOfEndpoints", 1)
    return n if n > 0 else 1


def random_pick(scored: Sequence[tuple[Endpoint, float]], n: int) -> ProfileResult:
    """`n` endpoints uniformly at random (random-picker, and weighted-random-picker when every score is 0)."""
    chosen = PICKER_RANDOM.sample(list(scored), min(n, len(scored)))
    return ProfileResult(targets=[ep for ep, _ in chosen], scores={ep.name: s for ep, s in chosen})


class CountPicker(Plugin):
    """A picker whose only parameter is `maxNumOfEndpoints`."""

    def __init__(self, name: str | None = None, max_num: int = 1) -> None:
        super().__init__(name)
        self.max_num = max_num

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        return cls(name, max_endpoints(params))
