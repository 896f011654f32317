"""The index's speculative entries against a plain model of them: (request key, pod) -> expiry, live while the
clock is before it. Random picks (prefixes shared between them, TTLs that renew each other up and down), pods
cleared and coming back, the clock moving on: every lookup and `speculative_only` must agree with the model."""

from __future__ import annotations

import random
from typing import Any

import pytest

from epp.framework.types import PrefixMatch
from epp.kvcache import index as index_mod
from epp.kvcache.index import TIER_GPU, MemoryIndex

PODS = ["a:1", "b:1", "c:1", "d:1"]


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


def _expected(model: dict[tuple[int, str], float], keys: list[int], now: float) -> dict[str, PrefixMatch]:
    out: dict[str, PrefixMatch] = {}
    for pod in PODS:
        n = 0
        for k in keys:
            if model.get((k, pod), -1.0) <= now:
                break
            n += 1
        if n:
            out[pod] = PrefixMatch(n, float(n))
    return out


@pytest.mark.parametrize("seed", range(8))
def test_speculative_entries_match_a_plain_model(monkeypatch: Any, seed: int) -> None:
    clock = _Clock()
    monkeypatch.setattr(index_mod, "time", clock)
    rng = random.Random(seed)
    idx = MemoryIndex()
    for pod in PODS:  # every pod known to the index (an event of its own on an unrelated key)
        idx.add([1], [10**9 + PODS.index(pod)], pod, TIER_GPU)
    prompts = [[rng.randrange(1, 60) for _ in range(rng.randrange(1, 12))] for _ in range(12)]
    for p in prompts[6:]:  # half the prompts continue another one: shared prefixes
        p[:0] = rng.choice(prompts[:6])
    model: dict[tuple[int, str], float] = {}
    for step in range(600):
        op = rng.random()
        if op < 0.6:
            keys, pod, ttl = rng.choice(prompts), rng.choice(PODS), rng.choice([0.5, 1.0, 3.0])
            idx.add_speculative(keys, pod, ttl)
            for k in keys:
                model[(k, pod)] = clock.now + ttl
        elif op < 0.65:
            pod = rng.choice(PODS)
            idx.clear_pod(pod)
            idx.add([1], [10**9 + PODS.index(pod)], pod, TIER_GPU)  # back at once, holding nothing speculative
            model = {kp: e for kp, e in model.items() if kp[1] != pod}
        else:
            clock.now += rng.choice([0.0, 0.1, 0.4, 1.0])
        keys = rng.choice(prompts)
        got = idx.lookup_now(keys, PODS)
        assert got == _expected(model, keys, clock.now), (seed, step)
        k, pod = rng.choice(keys), rng.choice(PODS)
        assert idx.speculative_only(pod, k) == (model.get((k, pod), -1.0) > clock.now), (seed, step)
    clock.now += 10.0
    idx.expire_speculative(clock.now)
    assert not idx._spec_bits
    assert not idx._spec
