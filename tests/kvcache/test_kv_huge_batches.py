"""A huge KV-event batch is decoded, applied and let go in steps, the event loop running between them (issue 15:
one 131,072-block batch held the loop ~0.6 s, then ~70 ms after slicing the apply), with the index ending up as
for the batch applied in one piece."""

from __future__ import annotations

import asyncio

import msgpack
import pytest
from prometheus_client import CollectorRegistry

from epp.kvcache.config import PoolConfig
from epp.kvcache.events import STEP_BYTES, DecodeError, decode_batch, unpack_steps
from epp.kvcache.index import MemoryIndex
from epp.kvcache.ingest import RELEASE_STEP, EventApplier
from epp.kvcache.metrics import PoolMetrics
from epp.kvcache.tokens import TokenProcessor
from epp.kvcache.workers import ShardedWorkers

BS = 256


def _payload(blocks: int, map_events: bool = False) -> tuple[bytes, list[int]]:
    hashes = list(range(10**12, 10**12 + blocks))
    tokens = [(i * 7919) % 150_000 for i in range(blocks * BS)]
    if map_events:
        ev: object = {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": None, "token_ids": tokens,
                      "block_size": BS}  # fmt: skip
    else:
        ev = ["BlockStored", hashes, None, tokens, BS, None, "GPU", None]
    return msgpack.packb([1.5, [ev, ["BlockRemoved", [10**12 + blocks - 1]]], 0]), tokens


@pytest.mark.parametrize("map_events", [False, True])
def test_unpack_steps_gives_what_unpackb_gives(map_events: bool) -> None:
    data, _ = _payload(600, map_events)
    steps = list(unpack_steps(data))
    assert len(steps) >= len(data) // STEP_BYTES
    assert all(s is None for s in steps[:-1])
    assert steps[-1] == msgpack.unpackb(data, raw=False, strict_map_key=False)


@pytest.mark.parametrize(
    "mutate",
    [lambda d: d[:-1], lambda d: d + b"\x00", lambda d: d[: len(d) // 2], lambda d: b"\xc1" + d],
    ids=["truncated", "extra", "half", "garbage"],
)
def test_unpack_steps_refuses_what_decode_batch_refuses(mutate: object) -> None:
    data, _ = _payload(600)
    bad = mutate(data)  # type: ignore[operator]
    with pytest.raises(DecodeError):
        decode_batch(bad)
    with pytest.raises(DecodeError):
        list(unpack_steps(bad))


async def test_huge_batch_lets_the_loop_run_while_decoding_applying_and_releasing() -> None:
    data, tokens = _payload(2048)  # 2 apply slices, but ~2.5 MB to decode and 512k token ids to let go
    assert len(data) > 30 * STEP_BYTES
    reg = CollectorRegistry()
    idx = MemoryIndex()
    pool = ShardedWorkers(EventApplier(idx, TokenProcessor(16)), PoolConfig(concurrency=1), PoolMetrics(reg))
    turns = 0
    done = False

    async def other() -> None:
        nonlocal turns
        while not done:
            turns += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(other())
    await asyncio.sleep(0)
    start = turns
    released: list[int] = []
    real = pool.apply_sliced

    async def watch(pod: str, model: str, batch: object) -> None:
        await real(pod, model, batch)  # type: ignore[arg-type]
        released.extend(len(x) for ev in batch.events for x in (getattr(ev, "token_ids", []),))  # type: ignore[attr-defined]

    pool.apply_sliced = watch  # type: ignore[method-assign]
    await pool.process("pod", "m", 0, data, None)
    done = True
    await task
    # The decode alone took ~len/STEP_BYTES turns of the loop; the release of 512k tokens ~8 more.
    assert turns - start >= len(data) // STEP_BYTES + len(tokens) // RELEASE_STEP - 2
    assert released[0] <= RELEASE_STEP
    # Same index as applying the decoded batch in one piece.
    whole = MemoryIndex()
    EventApplier(whole, TokenProcessor(16)).apply("pod", "m", decode_batch(data))
    tp = TokenProcessor(16)
    keys = tp.block_keys(tokens, "m")
    assert idx.lookup_now(keys)["pod"].blocks == whole.lookup_now(keys)["pod"].blocks == len(keys) - 16
    assert len(idx) == len(whole)
    assert reg.get_sample_value("kv_cache_events_blocks_total", {"op": "stored"}) == 2048


async def test_bad_large_payload_is_counted_like_a_small_one() -> None:
    reg = CollectorRegistry()
    pool = ShardedWorkers(EventApplier(MemoryIndex(), TokenProcessor(16)), PoolConfig(concurrency=1), PoolMetrics(reg))
    data, _ = _payload(600)
    await pool.process("pod", "m", 0, data[:-1], None)
    await pool.process("pod", "m", 1, b"\xc1", None)
    assert reg.get_sample_value("kv_cache_events_decode_errors_total") == 2
