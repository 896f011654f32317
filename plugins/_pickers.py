"""What the three pickers share: the `maxNumOfEndpoints` parameter (≤0 falls back to 1, like GIE)."""

from __future__ import annotations

import random

from epp.framework import Params

# One generator for all pickers (GIE shares a PickerRand); seedable in tests.
PICKER_RANDOM = random.Random()


def max_endpoints(p: Params) -> int:
    n = p.int("maxNumOfEndpoints", 1)
    return n if n > 0 else 1
