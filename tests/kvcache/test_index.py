"""One suite for every index backend (in-memory and Redis against a real redis-server)."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from epp.framework import SpeculationHold
from epp.kvcache.index import TIER_CPU, TIER_GPU, MemoryIndex, tier_index
from epp.kvcache.redis_index import RedisIndex

A, B, C = "10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"
_n = itertools.count()


@pytest.fixture(params=["memory", "memory-runs", "redis"])
async def index(request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    if request.param == "memory":
        yield MemoryIndex()
        return
    if request.param == "memory-runs":  # engine maps spill into sorted arrays after 2 entries
        yield MemoryIndex(engine_run_size=2)
        return
    url = request.getfixturevalue("redis_url")
    idx = RedisIndex(url, prefix=f"t{next(_n)}:")
    yield idx
    await idx.close()


async def entries(idx: Any) -> set[tuple[int, str, int]]:
    await idx.flush()
    if isinstance(idx, RedisIndex):
        return await idx.entries()
    idx.maintain()
    return idx.entries()


async def match(idx: Any, keys: list[int], pods: list[str] | None = None) -> dict[str, tuple[int, float]]:
    await idx.flush()
    return {p: (m.blocks, round(m.weighted, 6)) for p, m in (await idx.lookup(keys, pods)).items()}


async def test_longest_consecutive_prefix_from_block_zero(index: Any) -> None:
    index.add([1, 2, 3, 4], [11, 12, 13, 14], A, TIER_GPU)
    index.add([5, 6], [11, 12], B, TIER_GPU)
    index.add([7], [13], C, TIER_GPU)  # holds block 2 but not block 0: no prefix
    assert await match(index, [11, 12, 13, 14, 15]) == {A: (4, 4.0), B: (2, 2.0)}
    assert await match(index, [11, 12, 13], [B, C]) == {B: (2, 2.0)}
    assert await match(index, [99, 11]) == {}


async def test_tier_weights_take_the_best_tier_per_block(index: Any) -> None:
    index.add([1, 2], [11, 12], A, TIER_CPU)
    index.add([3], [11], B, TIER_GPU)
    index.add(None, [12], B, TIER_CPU)
    assert await match(index, [11, 12]) == {A: (2, 1.6), B: (2, 1.8)}
    index.add(None, [11, 12], A, TIER_GPU)
    assert (await match(index, [11, 12]))[A] == (2, 2.0)


async def test_evict_by_engine_key_and_count_unknown(index: Any) -> None:
    index.add([1, 2, 3], [11, 12, 13], A, TIER_GPU)
    assert index.evict([2, 99], A, TIER_GPU) == 1
    assert await entries(index) == {(11, A, 0), (13, A, 0)}
    assert index.request_key(A, 2) is None and index.request_key(A, 3) == 13
    assert index.evict([1], B, TIER_GPU) == 1  # unknown pod


async def test_engine_block_larger_than_canonical(index: Any) -> None:
    # one 64-token engine block = four 16-token canonical blocks (the i*len/n rule)
    index.add([7], [11, 12, 13, 14], A, TIER_GPU)
    assert index.request_key(A, 7) == 14  # the last one: the parent of the next store
    assert len(await entries(index)) == 4
    index.evict([7], A, TIER_GPU)
    assert await entries(index) == set()


async def test_engine_block_smaller_than_canonical(index: Any) -> None:
    index.add([1, 2, 3, 4], [11], A, TIER_GPU)
    assert index.request_key(A, 4) == 11
    index.evict([2], A, TIER_GPU)  # any part gone: the canonical block is no longer whole
    assert await entries(index) == set()


async def test_removal_is_reference_counted(index: Any) -> None:
    index.add([1], [11], A, TIER_GPU)
    index.add([1], [11], A, TIER_GPU)  # announced again (another DP rank / KV group)
    index.evict([1], A, TIER_GPU)
    assert await entries(index) == {(11, A, 0)}
    index.evict([1], A, TIER_GPU)
    assert await entries(index) == set()


async def test_gpu_removal_keeps_cpu_copy_and_mapping(index: Any) -> None:
    index.add([1], [11], A, TIER_GPU)
    index.add(None, [11], A, TIER_CPU)
    index.evict([1], A, TIER_GPU)
    assert await entries(index) == {(11, A, TIER_CPU)}
    assert index.request_key(A, 1) == 11
    index.evict([1], A, TIER_CPU)
    assert await entries(index) == set()


async def test_clear_pod_keeps_others_and_pod_can_come_back(index: Any) -> None:
    index.add([1, 2], [11, 12], A, TIER_GPU)
    index.add([3, 4], [11, 12], B, TIER_GPU)
    index.clear_pod(A)
    assert await match(index, [11, 12]) == {B: (2, 2.0)}
    assert index.request_key(A, 1) is None
    assert await entries(index) == {(11, B, 0), (12, B, 0)}
    index.add([5], [11], A, TIER_GPU)
    assert await match(index, [11, 12]) == {A: (1, 1.0), B: (2, 2.0)}


async def test_speculative_entries_expire(index: Any) -> None:
    index.add([1], [11], A, TIER_GPU)
    index.add_speculative([11, 12], B, 0.15)
    assert await match(index, [11, 12]) == {A: (1, 1.0), B: (2, 2.0)}
    await asyncio.sleep(0.2)
    assert await match(index, [11, 12]) == {A: (1, 1.0)}


async def test_speculation_writes_nothing_for_blocks_the_pod_holds_on_gpu(index: Any) -> None:
    """A warm pick speculates only what the pod's own events have not put on its GPU (a CPU copy does not count)."""
    local = index.local if isinstance(index, RedisIndex) else index
    index.add([1, 2], [11, 12], A, TIER_GPU)
    index.add([3], [11], B, TIER_CPU)
    index.add_speculative([11, 12, 13], A, 0.15)
    index.add_speculative([11, 12], B, 0.15)
    slot = {p: local._pods[p].shift // 4 for p in (A, B)}
    assert {s: sorted(m) for s, m in local._spec.items() if m} == {slot[A]: [13], slot[B]: [11, 12]}
    assert await match(index, [11, 12, 13]) == {A: (3, 3.0), B: (2, 2.0)}
    index.add_speculative([11, 12], A, 0.15)  # held: nothing new to expire
    assert len(local._spec_expiry) == 2
    await asyncio.sleep(0.2)
    assert await match(index, [11, 12, 13]) == {A: (2, 2.0), B: (1, 0.8)}


async def test_speculative_entries_of_mixed_ttls_expire_each_at_its_own_time(index: Any) -> None:
    """Entries shared by other replicas carry their own TTL, so a later entry can expire first; an entry written
    again lives to its later expiry; a cleared pod's entries are gone at once."""
    index.add_speculative([11, 12], A, 0.6)
    index.add_speculative([11, 12], B, 0.1)  # written after A's, expires before it
    index.add_speculative([11], C, 0.1)
    index.add_speculative([11], C, 0.6)  # rewritten: lives to the later expiry
    assert await match(index, [11, 12]) == {A: (2, 2.0), B: (2, 2.0), C: (1, 1.0)}
    await asyncio.sleep(0.25)
    assert await match(index, [11, 12]) == {A: (2, 2.0), C: (1, 1.0)}
    index.clear_pod(C)
    assert await match(index, [11, 12]) == {A: (2, 2.0)}
    index.add_speculative([12], B, 0.6)  # block 12 alone: no prefix from block 0 for B
    assert await match(index, [11, 12]) == {A: (2, 2.0)}
    await asyncio.sleep(0.5)
    assert await match(index, [11, 12]) == {}


async def test_a_held_speculative_entry_outlives_its_ttl_until_events_or_its_end(index: Any) -> None:
    """speculativeHold: a pick's entries stay while the pod's events do not hold its last block and the request has
    not ended, then run their TTL from the end; the pod's events confirming the blocks end the hold at once; the cap
    ends it too. A plain entry written beside them expires on its TTL."""
    now = time.monotonic()
    queued = SpeculationHold(0.1, 5.0, now)
    confirmed = SpeculationHold(0.1, 5.0, now)
    capped = SpeculationHold(0.1, 0.25, now)
    index.add_speculative([11, 12], A, 0.1, queued)
    index.add_speculative([21, 22], B, 0.1, confirmed)
    index.add_speculative([31], C, 0.1, capped)
    index.add_speculative([41], C, 0.1)
    await asyncio.sleep(0.15)
    assert await match(index, [11, 12]) == {A: (2, 2.0)}  # past its TTL, still held
    assert await match(index, [21, 22]) == {B: (2, 2.0)}
    assert await match(index, [31]) == {C: (1, 1.0)}
    assert await match(index, [41]) == {}
    index.add([1, 2], [21, 22], B, TIER_GPU)  # B's events: the prefill is done
    queued.end(time.monotonic())
    await asyncio.sleep(0.15)  # queued: its TTL from the end has run; capped: past its cap
    assert await match(index, [11, 12]) == {}
    assert await match(index, [31]) == {}
    index.evict([1, 2], B, TIER_GPU)
    assert await match(index, [21, 22]) == {}  # the held entry went when the events held the blocks


async def test_speculative_only_names_a_block_no_event_put_on_the_pod(index: Any) -> None:
    """The closed loop's test for a match resting on a pick's entry: true while only the speculation holds the
    block on that pod, false once the pod's events hold it (any tier) and for other pods and blocks."""
    index.add([5], [11], B, TIER_CPU)
    index.add_speculative([11, 12], A, 5.0)
    assert index.speculative_only(A, 12) and index.speculative_only(A, 11)
    assert not index.speculative_only(B, 11) and not index.speculative_only(A, 13) and not index.speculative_only(C, 12)
    index.add([1, 2], [11, 12], A, TIER_CPU)  # the events arrive after the pick
    assert not index.speculative_only(A, 12) and not index.speculative_only(A, 11)


async def test_a_held_entry_does_not_outlive_its_pod(index: Any) -> None:
    """A cleared pod's held entries go with it, and its slot's next pod does not inherit their hold."""
    index.add_speculative([11, 12], A, 0.05, SpeculationHold(0.05, 5.0, time.monotonic()))
    index.clear_pod(A)
    index.add_speculative([11, 12], B, 0.15)  # B takes A's slot
    local = index.local if isinstance(index, RedisIndex) else index
    assert local._pods[B].shift == 0
    assert await match(index, [11, 12]) == {B: (2, 2.0)}
    await asyncio.sleep(0.25)
    assert await match(index, [11, 12]) == {}


async def test_redis_is_shared_by_replicas(redis_url: str) -> None:
    a = RedisIndex(redis_url, prefix="shared:")
    b = RedisIndex(redis_url, prefix="shared:")  # a replica that ingested nothing
    try:
        a.add([1, 2], [11, 12], A, TIER_GPU)
        await a.flush()
        assert {p: m.blocks for p, m in (await b.lookup([11, 12])).items()} == {A: 2}
        a.clear_pod(A)
        await a.flush()
        assert await b.lookup([11, 12]) == {}
        assert await b.redis.exists("shared:p:" + A) == 0
    finally:
        await a.close()
        await b.close()


def test_memory_lru_bound_and_entries_per_key() -> None:
    idx = MemoryIndex(max_keys=3, max_pods_per_key=2)
    idx.add([1, 2, 3, 4], [11, 12, 13, 14], A, TIER_GPU)
    assert len(idx) == 3 and idx.lru_evictions == 1
    assert {e[0] for e in idx.entries()} == {12, 13, 14}
    idx.add([5], [12], B, TIER_GPU)
    idx.add([6], [12], C, TIER_GPU)
    assert len([e for e in idx.entries() if e[0] == 12]) == 2


def test_cleared_slots_are_swept_and_reused() -> None:
    idx = MemoryIndex()
    for i in range(20):
        idx.add(list(range(i * 100, i * 100 + 50)), list(range(10_000 + i * 100, 10_000 + i * 100 + 50)), A, 0)
    idx.add([1], [10_000], B, 0)
    idx.clear_pod(A)
    assert idx.lookup_now(list(range(10_000, 10_050))) == {B: idx.lookup_now([10_000])[B]}
    idx.maintain()
    assert len(idx) == 1
    idx.add([2], [5], C, 0)  # reuses A's slot without inheriting anything
    assert idx.entries() == {(10_000, B, 0), (5, C, 0)}


def test_tier_names() -> None:
    assert tier_index("GPU") == tier_index(None) == TIER_GPU
    assert tier_index("CPU") == TIER_CPU
    assert tier_index("STORAGE") == tier_index("disk") == 2
    assert tier_index("nvme-pool") == 3


def test_engine_map_runs_shadow_tombstone_and_compact() -> None:
    from epp.kvcache.index import EngineMap

    m = EngineMap(run_size=4)
    for e in range(10, 18):
        m[e] = e * 100
    assert len(m.runs) == 2 and not m.recent and len(m) == 8
    assert m.get(13) == 1300 and m.get(99) is None
    m[13] = 7  # a newer value shadows the spilled one
    assert m.get(13) == 7
    del m[13]
    assert m.get(13) is None and len(m) == 7
    for e in (10, 11, 12):
        del m[e]
    assert len(m.runs) == 1  # the first run died entirely and was dropped
    assert [m.get(e) for e in (14, 15, 16, 17)] == [1400, 1500, 1600, 1700]
    big = (1 << 64) - 1
    for e in (big, big - 1, big - 2, big - 3):
        m[e] = 5
    assert m.get(big) == 5


@pytest.mark.parametrize("fanout,step", [(2, 3), (4, 7), (3, 1000)])
def test_engine_map_incremental_merges_match_a_dict(fanout: int, step: int) -> None:
    """Random writes, overwrites, single and batch removals and lookups against a plain dict, with runs
    spilled and merged (and compacted) in small slices while lookups and removals go on."""
    import random

    from epp.kvcache.index import EngineMap

    rnd = random.Random(fanout * 1000 + step)
    m = EngineMap(run_size=8, fanout=fanout, step=step, step_every=3)
    model: dict[int, int] = {}
    universe = [rnd.getrandbits(64) for _ in range(300)] + [0, 1, (1 << 64) - 1]
    merges_seen = 0
    for n in range(6000):
        op = rnd.random()
        if op < 0.55:
            e = rnd.choice(universe)
            v = rnd.randrange(1, 1 << 63)
            m[e] = v
            model[e] = v
        elif op < 0.7:
            e = rnd.choice(universe)
            del m[e]
            model.pop(e, None)
        elif op < 0.8:
            batch = rnd.sample(universe, 12)
            m.delete_many(batch)
            for e in batch:
                model.pop(e, None)
        else:
            batch = rnd.sample(universe, 20)
            assert m.get_many(batch) == [model.get(e) for e in batch]
        merges_seen += m._merge is not None
        if n % 500 == 0:
            assert all(m.get(e) == model.get(e) for e in universe)
    assert all(m.get(e) == model.get(e) for e in universe)
    assert m.merges > 20
    if step < 100:
        assert merges_seen > 100  # merges really ran interleaved with the other operations
    assert len(m.runs) <= 6 * fanout  # tiered merging keeps the run count bounded (~fanout per level)


def test_engine_map_slices_are_bounded_and_never_share_a_call_with_a_spill(monkeypatch: pytest.MonkeyPatch) -> None:
    """A write's pause is one spill or one merge slice of at most `step` entries: never both, and never a bigger
    slice when runs pile up (they get slices more often instead)."""
    import random

    from epp.kvcache import index as ix

    calls: list[tuple[str, int]] = []
    step, spill = ix._Merge.step, ix.EngineMap._spill

    def counted_step(self: Any, budget: int) -> bool:
        calls.append(("step", budget))
        return step(self, budget)

    def counted_spill(self: Any) -> None:
        calls.append(("spill", 0))
        spill(self)

    monkeypatch.setattr(ix._Merge, "step", counted_step)
    monkeypatch.setattr(ix.EngineMap, "_spill", counted_spill)
    m = ix.EngineMap(run_size=16, fanout=2, step=8, step_every=4)
    rnd = random.Random(3)
    keys = [rnd.getrandbits(64) for _ in range(5000)]
    for i in range(0, len(keys), 5):
        calls.clear()
        m.update([(e, 1) for e in keys[i : i + 5]], 5)
        kinds = [k for k, _ in calls]
        assert kinds.count("spill") + kinds.count("step") <= 1, kinds
        assert all(b == 8 for k, b in calls if k == "step")
    assert m.merges > 50
    assert all(m.get(e) == 1 for e in keys)
