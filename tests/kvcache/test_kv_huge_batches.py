"""A huge KV-event batch is decoded, applied and let go in steps, the event loop running between them (issue 15:
one 131,072-block batch held the loop ~0.6 s, then ~70 ms after slicing the apply), with the index ending up as
for the batch applied in one piece."""

from __future__ import annotations

import asyncio
import contextlib

import msgpack
import pytest
from prometheus_client import CollectorRegistry

from epp.framework.types import Endpoint
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
