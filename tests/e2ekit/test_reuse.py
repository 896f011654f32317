"""The reuse bounds: hand-computed cases (Belady against LRU, capacity below the working set, warm-up) and, on
random prefix trees, that the capacity bound sits between what the simulator's own caches deliver under any
placement and the unlimited bound."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from e2e.sim.kvcache import KVCache
from e2e.workloads.base import Request
from e2e.workloads.reuse import capacity_bound, reuse_bound

BS = 16


def blocks(*names: str, extra: int = 1) -> list[int]:
    """Token ids: one full block per name (its 16 ids derived from the name), then `extra` tokens of its own."""
    ids = [hash((n, i)) % 50_000 for n in names for i in range(BS)]
    return ids + [50_000 + hash(names) % 1000 + i for i in range(extra)]


def bounds(prompts: Sequence[list[int]], capacity: int, count_after: float = 0.0) -> tuple[int, int]:
    reqs = [Request(arrival=float(i), api="completions", body={}) for i in range(len(prompts))]
    ids = [list(p) for p in prompts]
    inf = reuse_bound(reqs, BS, ids=ids, count_after=count_after)
    cap = capacity_bound(reqs, BS, capacity, ids=ids, count_after=count_after)
    assert cap.prompt_tokens == inf.prompt_tokens
    return inf.reusable_tokens, cap.reusable_tokens


def lru_hits(prompts: Sequence[list[int]], pods: int, capacity: int, place: Sequence[int]) -> int:
    """Prompt tokens the simulator's KV caches (LRU, a chain evicted from its tail) serve under a placement."""
    caches = [KVCache(num_blocks=capacity, block_size=BS, emit=lambda _: None) for _ in range(pods)]
    hit = 0
    for toks, p in zip(prompts, place, strict=True):
        kv = caches[p]
        alloc = kv.allocate(kv.block_hashes(toks), len(toks), len(toks) + 1)
        hit += alloc.hit_blocks * BS
        kv.register(alloc, toks, None, None)
        kv.release(alloc)
    return hit


def test_belady_keeps_what_is_needed_soonest_where_lru_keeps_nothing() -> None:
    a, b, c = blocks("a"), blocks("b"), blocks("c")
    prompts = [a, b, c, a, b, c]
    # LRU with 2 blocks evicts each block just before it comes back: no hit at all
    assert lru_hits(prompts, 1, 2, [0] * 6) == 0
    # Belady drops c (needed last) and hits a and b; unlimited, all three hit once more
    assert bounds(prompts, 2) == (3 * BS, 2 * BS)


def test_capacity_below_the_working_set_and_whole_chains() -> None:
    a, b = blocks("a1", "a2"), blocks("b1")
    prompts = [a, b, a, b]
    # 2 blocks: keeping a's chain (needed next) beats caching b1; the unlimited cache also hits b1 again
    assert bounds(prompts, 2) == (3 * BS, 2 * BS)
    # room for everything: the capacity bound is the unlimited one
    assert bounds(prompts, 3) == (3 * BS, 3 * BS)
    # one block: a1 is the block needed soonest, so the second a hits one block
    assert bounds(prompts, 1) == (3 * BS, 1 * BS)


def test_warm_up_and_never_hit_last_blocks_fill_but_do_not_count() -> None:
    x = blocks("x1", "x2", extra=0)  # 32 tokens: the last token is computed, so block x2 cannot hit here
    y = blocks("x1", "x2", "y3")  # extends x: hits x1 and x2
    z = blocks("z1")
    # x2 is stored by x's request though it could not hit there; y then hits both (the capacity suffices)
    assert bounds([x, y], 2) == (2 * BS, 2 * BS)
    # x is a warm-up request: it fills the cache, and only y is counted
    assert bounds([x, y], 2, count_after=0.5) == (2 * BS, 2 * BS)
    # with one block, a warm-up z then x, y: z's block is never needed again, x1 is what y hits
    assert bounds([z, x, y], 1, count_after=0.5) == (2 * BS, 1 * BS)


def random_prefix_tree(rng: random.Random, n: int, max_blocks: int) -> list[list[int]]:
    """Prompts that extend an earlier prompt's prefix by a few blocks, or start a new tree."""
    prompts: list[list[int]] = []
    for _ in range(n):
        base: list[int] = []
        if prompts and rng.random() < 0.8:
            parent = rng.choice(prompts)
            base = parent[: BS * rng.randint(0, len(parent) // BS)]
        grow = rng.randint(1, 3) * BS + rng.randint(0, BS - 1)
        toks = base + [rng.randrange(50_000) for _ in range(grow)]
        prompts.append(toks[: max_blocks * BS - 2])
    return prompts


@pytest.mark.parametrize("seed", range(6))
def test_the_capacity_bound_bounds_every_placement_on_the_simulators_caches(seed: int) -> None:
    rng = random.Random(seed)
    pods, per_pod = 3, 12
    prompts = random_prefix_tree(rng, 60, per_pod)
    inf, cap = bounds(prompts, pods * per_pod)
    assert cap <= inf
    # placements a router could make: random, round-robin, all on one pod, by first block (prefix affinity)
    placements = [[rng.randrange(pods) for _ in prompts] for _ in range(20)]
    placements += [[i % pods for i in range(len(prompts))], [0] * len(prompts)]
    placements.append([p[0] % pods for p in prompts])
    best = max(lru_hits(prompts, pods, per_pod, place) for place in placements)
    assert best <= cap
    # Belady over the pooled cache is at least the pooled cache under LRU, and grows with the capacity
    assert lru_hits(prompts, 1, pods * per_pod, [0] * len(prompts)) <= cap
    caps = [bounds(prompts, c)[1] for c in (4, 12, 24, pods * per_pod, 1000)]
    assert caps == sorted(caps)
    assert caps[-1] == inf


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError, match="capacity_blocks"):
        bounds([blocks("a")], 0)
