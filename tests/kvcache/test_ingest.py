"""A huge KV-event batch is decoded, applied and let go in steps, the event loop running between them (issue 15:
one 131,072-block batch held the loop ~0.6 s, then ~70 ms after slicing the apply), with the index ending up as
for the batch applied in one piece."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import zlib

import msgpack
import pytest
from prometheus_client import CollectorRegistry

from epp.framework.types import Endpoint
from epp.kvcache.config import PoolConfig
from epp.kvcache.events import (
    MASK_STEP,
    STEP_BYTES,
    DecodeError,
    EventBatch,
    batch_from_raw,
    decode_batch,
    mask_steps,
    unpack_steps,
)
from epp.kvcache.index import MemoryIndex
from epp.kvcache.ingest import RELEASE_STEP, EventApplier
from epp.kvcache.metrics import PoolMetrics
from epp.kvcache.tokens import TokenProcessor
from epp.kvcache.workers import CRC_STEP, ShardedWorkers, crc32_sliced

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


async def test_queued_payload_bytes_are_bounded() -> None:
    """Batches waiting for the workers are bounded in bytes too (the queues were bounded only in count: 10,000 per
    shard, of any size); past it a batch is dropped as a full queue's is, and the replay repairs the gap."""
    reg = CollectorRegistry()
    cfg = PoolConfig(concurrency=1, max_queued_bytes=1_000_000)
    pool = ShardedWorkers(EventApplier(MemoryIndex(), TokenProcessor(16)), cfg, PoolMetrics(reg))
    big = msgpack.packb([0.0, [["BlockRemoved", [1]]], b"x" * 600_000])
    seq = (0).to_bytes(8, "big")
    assert pool.submit([b"kv@p@m", seq, big], None)
    assert not pool.submit([b"kv@p@m", (1).to_bytes(8, "big"), big], None)
    assert pool.queued_bytes == len(big)
    assert reg.get_sample_value("kv_cache_events_dropped_total", {"reason": "queue_bytes"}) == 1
    pool.start()
    try:
        await pool.drain()
        assert pool.queued_bytes == 0
        assert pool.submit([b"kv@p@m", (2).to_bytes(8, "big"), big], None)
        await pool.drain()
        assert pool.queued_bytes == 0
    finally:
        await pool.stop()


async def test_oversized_zmq_message_is_refused_and_the_stream_goes_on() -> None:
    """A KV-event message over maxMessageBytes never reaches the EPP's memory (ZMQ refuses it and drops that
    connection); the publisher reconnects and its next batches are applied."""
    import socket

    import zmq

    from epp.kvcache.pool import EventPool

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    reg = CollectorRegistry()
    idx = MemoryIndex()
    cfg = PoolConfig(zmq_endpoint=f"tcp://127.0.0.1:{port}", discover_pods=False, max_message_bytes=100_000)
    pool = EventPool(EventApplier(idx, TokenProcessor(16)), cfg, PoolMetrics(reg))
    task = asyncio.create_task(pool.run())
    pub: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.PUB)
    try:
        await pool.started()
        pool.subscriptions.endpoint_added(Endpoint("p", "10.0.0.1", 8000))
        pub.connect(f"tcp://127.0.0.1:{port}")
        await asyncio.sleep(0.3)
        # A valid batch (the padding is a 4th field, which decoding ignores), only too large.
        huge = msgpack.packb(
            [0.0, [["BlockStored", [1], None, list(range(16)), 16, None, None, None]], 0, b"x" * 200_000]
        )
        small = msgpack.packb([0.0, [["BlockStored", [2], None, list(range(100, 116)), 16, None, None, None]]])
        seq = 0
        for _ in range(100):
            for payload in (huge, small):
                pub.send_multipart([b"kv@10.0.0.1:8000@m", seq.to_bytes(8, "big"), payload])
                seq += 1
            await asyncio.sleep(0.05)
            if len(idx):
                break
        for _ in range(5):  # a connection that got the small one also gets the huge ones sent after it
            pub.send_multipart([b"kv@10.0.0.1:8000@m", seq.to_bytes(8, "big"), huge])
            seq += 1
            await asyncio.sleep(0.05)
        await pool.workers.drain()
        assert len(idx) == 1
        assert idx.lookup_now(TokenProcessor(16).block_keys(list(range(100, 116)), "m"))["10.0.0.1:8000"].blocks == 1
        assert not idx.lookup_now(TokenProcessor(16).block_keys(list(range(16)), "m"))
    finally:
        pub.close(linger=0)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _turn_counter() -> tuple[list[int], asyncio.Event]:
    count = [0]
    stop = asyncio.Event()

    async def other() -> None:
        while not stop.is_set():
            count[0] += 1
            await asyncio.sleep(0)

    asyncio.get_running_loop().create_task(other())
    return count, stop


@pytest.mark.parametrize("map_events", [False, True])
async def test_long_hash_lists_are_masked_and_let_go_in_steps(map_events: bool) -> None:
    """A removal of 200k blocks is small on the wire (~1.8 MB) but its hash list was masked in one piece after the
    stepped unpack (5 ms per 131k hashes here) and the raw list freed at once: now both go MASK_STEP at a time."""
    # A negative int and a bytes hash at the end: read as decode_batch reads them.
    hashes = [10**12 + i for i in range(200_000)] + [-5, b"\x00\x07"]
    ev: object = {"type": "BlockRemoved", "block_hashes": hashes} if map_events else ["BlockRemoved", hashes]
    data = msgpack.packb([1.5, [ev], 0])
    pool = ShardedWorkers(
        EventApplier(MemoryIndex(), TokenProcessor(16)), PoolConfig(concurrency=1), PoolMetrics(CollectorRegistry())
    )
    turns, stop = _turn_counter()
    await asyncio.sleep(0)
    start = turns[0]
    batch = await pool.decode_sliced("pod", data)
    stop.set()
    unpack_turns = len(data) // STEP_BYTES
    assert turns[0] - start >= unpack_turns + 2 * (len(hashes) // MASK_STEP) - 2
    assert batch == decode_batch(data)
    assert batch is not None and batch.events[0].block_hashes[-2:] == [(1 << 64) - 5, 7]  # type: ignore[union-attr]


def test_mask_steps_leaves_malformed_hashes_to_decode() -> None:
    bad = [1] * (MASK_STEP + 1) + [1.5]
    raw = msgpack.unpackb(msgpack.packb([0.0, [["BlockRemoved", bad]], 0]))
    with pytest.raises(DecodeError):
        list(mask_steps(raw))
    raw = msgpack.unpackb(msgpack.packb([0.0, [["BlockRemoved", "x" * 70_000], {"type": "Nope"}, 3], 0]))
    assert list(mask_steps(raw)) == []
    with pytest.raises(DecodeError):
        batch_from_raw(raw)


async def test_crc32_sliced_matches_zlib_and_yields() -> None:
    data = bytes(range(256)) * 20_000  # ~5 MB
    turns, stop = _turn_counter()
    await asyncio.sleep(0)
    start = turns[0]
    assert await crc32_sliced(data) == zlib.crc32(data)
    stop.set()
    assert turns[0] - start >= len(data) // CRC_STEP
    assert await crc32_sliced(b"abc") == zlib.crc32(b"abc")


async def test_gc_is_paused_while_a_large_batch_is_applied_only() -> None:
    """The one young-generation collection that ran during a 131,072-block batch walked its two-million-item
    lists whole (11-16 ms of CPU in one piece); the cyclic GC is off while a large batch is processed, back on
    after, and left alone when it was already off."""
    pool = ShardedWorkers(
        EventApplier(MemoryIndex(), TokenProcessor(16)), PoolConfig(concurrency=1), PoolMetrics(CollectorRegistry())
    )
    seen: list[bool] = []
    real = pool.apply

    def watch(pod: str, model: str, batch: EventBatch) -> None:
        seen.append(gc.isenabled())
        real(pod, model, batch)

    pool.apply = watch  # type: ignore[method-assign]
    big, _ = _payload(600)
    small = msgpack.packb([0.0, [["BlockStored", [7], None, list(range(16)), 16, None, None, None]], 0])
    assert gc.isenabled()
    await pool.process("pod", "m", 0, big, None)
    assert seen and not any(seen)
    assert gc.isenabled()
    seen.clear()
    await pool.process("pod", "m", 1, small, None)
    assert seen == [True]
    gc.disable()
    try:
        await pool.process("pod", "m", 2, big, None)
        assert not gc.isenabled()  # someone else's choice: not turned back on
    finally:
        gc.enable()
