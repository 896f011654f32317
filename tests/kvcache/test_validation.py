"""Hostile KV events are refused before they change shared state, and a real pod still routes afterwards."""

from __future__ import annotations

import msgpack
from prometheus_client import CollectorRegistry

from epp.framework.types import Endpoint, Metrics
from epp.kvcache.config import PoolConfig
from epp.kvcache.metrics import PoolMetrics
from epp.kvcache.service import KVCacheService, KVCacheSettings
from epp.kvcache.validation import MAX_MODELS_PER_POD, MAX_RANKS_PER_POD, Budgets
from epp.kvcache.workers import ShardedWorkers

MODEL = "m"
REAL = "10.0.0.1:8000"
EVIL = "10.0.0.2:8000"
PROMPT = list(range(1000, 1000 + 16 * 12))  # 12 blocks of 16


def _rig(settings: KVCacheSettings | None = None) -> tuple[KVCacheService, ShardedWorkers, CollectorRegistry]:
    svc = KVCacheService(settings or KVCacheSettings())  # block size learned per model (no blockSize configured)
    reg = CollectorRegistry()
    return svc, ShardedWorkers(svc.applier, PoolConfig(concurrency=1), PoolMetrics(reg)), reg


def _store(hashes: list[int], tokens: list[int], bs: int, parent: int | None = None) -> list[object]:
    return ["BlockStored", hashes, parent, tokens, bs, None, "GPU", None]


def _batch(*events: list[object], rank: int = 0, ts: float = 1.7e9) -> bytes:
    return msgpack.packb([ts, list(events), rank])


def _real_store(bs: int = 16) -> bytes:
    n = len(PROMPT) // bs
    return _batch(_store(list(range(500, 500 + n)), PROMPT, bs))


async def _routes_to_real(svc: KVCacheService) -> int:
    keys = svc.request_keys(PROMPT, MODEL)
    got = await svc.match(keys)
    return got[REAL].blocks if REAL in got else 0


def _skipped(reg: CollectorRegistry, reason: str) -> float:
    return reg.get_sample_value("kv_cache_events_skipped_total", {"reason": reason}) or 0.0


async def test_one_forged_block_size_does_not_fix_the_model() -> None:
    """One event with block_size 2**40 first used to fix the model's size until restart: real pods then indexed
    nothing (`canonical block size 1099511627776 exceeds the engine's 16`)."""
    svc, w, reg = _rig()
    await w.process(EVIL, MODEL, 0, _batch(_store([1], [7] * 16, 2**40)), None)
    assert _skipped(reg, "block_size") == 1 and svc.block_sizes.get(MODEL) is None
    await w.process(REAL, MODEL, 0, _real_store(), None)
    assert await _routes_to_real(svc) == 12


async def test_a_pods_block_size_does_not_change_and_its_scraped_size_wins() -> None:
    svc, w, reg = _rig()
    # a plausible but wrong size, self-consistent (32 tokens a block), learned first: provisional
    await w.process(EVIL, MODEL, 0, _batch(_store([1, 2], list(range(64)), 32)), None)
    assert svc.block_sizes.get(MODEL) == 32 and svc.block_sizes.provisional(MODEL)
    # the same pod cannot then switch size
    await w.process(EVIL, MODEL, 1, _batch(_store([3], list(range(16)), 16, parent=2)), None)
    assert _skipped(reg, "block_size") == 1
    # a pod whose scraped cache_config_info says 16 confirms 16: it replaces the provisional 32
    w.applier.guard.endpoints[REAL] = Endpoint("real", "10.0.0.1", 8000, metrics=Metrics(cache_block_size=16))
    await w.process(REAL, MODEL, 0, _real_store(), None)
    assert svc.block_sizes.get(MODEL) == 16 and not svc.block_sizes.provisional(MODEL)
    assert await _routes_to_real(svc) == 12
    assert EVIL not in await svc.match(svc.request_keys(list(range(64)), MODEL))  # keyed at 32: cleared
    # and a store from that pod at another size than its scraped one is refused
    await w.process(REAL, MODEL, 1, _batch(_store([900], list(range(32)), 32)), None)
    assert _skipped(reg, "block_size") == 2


async def test_hashes_are_bounded_by_the_tokens_they_cover() -> None:
    """1,000,000 hashes for 16 tokens used to add a million blocks (RSS 373 → 717 MB, the loop stalled 822 ms)."""
    svc, w, reg = _rig()
    await w.process(EVIL, MODEL, 0, _batch(_store(list(range(1, 1_000_001)), [7] * 16, 16)), None)
    assert _skipped(reg, "too_many_hashes") == 1 and svc.applier.guard.blocks(EVIL) == 0
    assert len(svc.index) == 0  # type: ignore[arg-type]
    await w.process(REAL, MODEL, 0, _real_store(), None)
    assert await _routes_to_real(svc) == 12


async def test_per_pod_block_budget_and_rate() -> None:
    svc, w, reg = _rig()
    svc.applier.guard.budgets = Budgets(max_blocks_per_pod=20, blocks_per_second=1.0, burst_blocks=30)
    await w.process(REAL, MODEL, 0, _real_store(), None)  # 12 blocks: within both
    toks = list(range(5000, 5000 + 16 * 10))
    await w.process(REAL, MODEL, 1, _batch(_store(list(range(700, 710)), toks, 16)), None)  # 22 > 20 blocks
    assert _skipped(reg, "budget") == 1 and svc.applier.guard.blocks(REAL) == 12
    svc.applier.guard.budgets = Budgets(max_blocks_per_pod=1000, blocks_per_second=1.0, burst_blocks=30)
    await w.process(EVIL, MODEL, 0, _batch(_store(list(range(800, 812)), PROMPT, 16)), None)
    await w.process(EVIL, MODEL, 1, _batch(_store(list(range(900, 912)), [1] * 192, 16)), None)
    await w.process(EVIL, MODEL, 2, _batch(_store(list(range(950, 962)), [2] * 192, 16)), None)  # 36 > burst 30
    assert _skipped(reg, "rate") == 1
    assert await _routes_to_real(svc) == 12


async def test_timestamps_and_ranks_are_checked() -> None:
    svc, w, reg = _rig()
    for ts in (float("nan"), float("inf"), -1.0, 1e300):
        await w.process(EVIL, MODEL, 0, _batch(_store([1], [7] * 16, 16), ts=ts), None)
    await w.process(EVIL, MODEL, 0, _batch(_store([1], [7] * 16, 16), rank=2**40), None)
    assert reg.get_sample_value("kv_cache_events_decode_errors_total") == 5
    for rank in range(MAX_RANKS_PER_POD + 3):  # a new rank per batch: bounded per pod
        await w.process(EVIL, MODEL, 0, _batch(["AllBlocksCleared"], rank=rank), None)
    assert w.seq.ranks(EVIL) == list(range(3, MAX_RANKS_PER_POD + 3))  # the least recent ones forgotten
    assert reg.get_sample_value("kv_cache_events_state_evicted_total", {"kind": "rank"}) == 3
    await w.process(REAL, MODEL, 0, _real_store(), None)
    assert await _routes_to_real(svc) == 12


async def test_forged_ranks_do_not_lock_a_real_rank_out() -> None:
    """Central bind: ranks forged under a real pod's topic fill its room before its own rank 0 speaks; the real
    rank still gets in (the least recent forged one makes room) and routes."""
    svc, w, _reg = _rig()
    for rank in range(1, MAX_RANKS_PER_POD + 1):
        await w.process(REAL, MODEL, 0, _batch(["AllBlocksCleared"], rank=rank), None)
    await w.process(REAL, MODEL, 0, _real_store(), None)
    assert await _routes_to_real(svc) == 12
    assert 0 in w.seq.ranks(REAL) and 1 not in w.seq.ranks(REAL)
    assert len(w.seq.ranks(REAL)) == MAX_RANKS_PER_POD


async def test_forged_topics_in_central_mode_are_bounded_per_pod() -> None:
    svc, w, reg = _rig()
    w.known_pods = {REAL}  # central bind: only the pool's pods
    seq = (0).to_bytes(8, "big")
    for i in range(MAX_MODELS_PER_POD + 5):
        w.submit([f"kv@{REAL}@forged-{i}".encode(), seq, _batch(["AllBlocksCleared"])], None)
    assert reg.get_sample_value("kv_cache_events_state_evicted_total", {"kind": "model"}) == 5
    assert len(w._models[REAL]) == MAX_MODELS_PER_POD
    assert not w.submit([f"kv@{EVIL}@{MODEL}".encode(), seq, _batch(["AllBlocksCleared"])], None)
    # The forged models filled the real pod's room first: its own model's events still get in, and route.
    assert w.submit([f"kv@{REAL}@{MODEL}".encode(), seq, _real_store()], None)
    await w.process(REAL, MODEL, 0, _real_store(), None)
    assert await _routes_to_real(svc) == 12
