"""The breakdown benchmark's send order: no path is always sent right after the same other path."""

from __future__ import annotations

import itertools
import random
from collections import Counter

from e2e.bench.cost.breakdown import interleaved


def test_every_path_once_per_round() -> None:
    names = ["envoy alone", "python floor", "python floor 2", "epp precise"]
    order = interleaved(names, 50, random.Random(0))
    assert len(order) == 200
    for r in range(50):
        assert sorted(order[4 * r : 4 * r + 4]) == sorted(names)


def test_each_path_follows_every_other() -> None:
    # A fixed cyclic order (rotated per repeat) gives each path one predecessor; identical floors then differed by
    # position alone. Here each path's predecessors spread over all the other paths.
    names = ["envoy alone", "python floor", "python floor 2", "epp precise"]
    order = interleaved(names, 400, random.Random(1))
    before: dict[str, Counter[str]] = {n: Counter() for n in names}
    for prev, cur in itertools.pairwise(order):
        before[cur][prev] += 1
    for cur, prevs in before.items():
        others = [n for n in names if n != cur]
        counts = [prevs[n] for n in others]
        assert min(counts) > 0.6 * max(counts), (cur, prevs)
