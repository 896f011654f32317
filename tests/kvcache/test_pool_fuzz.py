"""Hypothesis-driven ZMQ messages into the event pool: malformed frames, garbage payloads, msgpack of any shape,
wild sequence numbers. Nothing raises out of the pool, every message is counted, and a valid batch for a fresh
pod afterwards still lands in the index."""

from __future__ import annotations

import asyncio
from typing import Any

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from epp.kvcache.config import PoolConfig
from epp.kvcache.index import MemoryIndex
from epp.kvcache.ingest import EventApplier
from epp.kvcache.metrics import PoolMetrics
from epp.kvcache.pool import EventPool
from epp.kvcache.tokens import TokenProcessor

leaf = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(allow_nan=True), st.text(max_size=8),
    st.binary(max_size=8),
)  # fmt: skip
value = st.recursive(leaf, lambda c: st.lists(c, max_size=5), max_leaves=25)
event = st.one_of(
    value,
    st.tuples(
        st.sampled_from(["BlockStored", "BlockRemoved", "AllBlocksCleared", "Other"]),
        st.lists(st.integers(-(2**63), 2**64 - 1), max_size=6), value,
        st.lists(st.integers(-(2**40), 2**40), max_size=12), st.integers(-3, 64), value,
    ).map(list),
)  # fmt: skip
payload = st.one_of(
    st.binary(max_size=60),
    st.tuples(st.floats(allow_nan=False), st.lists(event, max_size=4)).map(lambda t: msgpack.packb(list(t))),
    st.tuples(st.floats(allow_nan=False), st.lists(event, max_size=4), value).map(lambda t: msgpack.packb(list(t))),
)
seqb = st.one_of(st.integers(0, 2**64 - 1).map(lambda s: s.to_bytes(8, "big")), st.binary(max_size=10))
topic = st.one_of(st.just(b"kv@p@m"), st.just(b"kv@q@m"), st.binary(max_size=20))
message = st.one_of(st.tuples(topic, seqb, payload).map(list), st.lists(st.binary(max_size=20), max_size=5))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages=st.lists(message, max_size=12))
def test_any_frames_leave_the_pool_working(messages: list[list[bytes]]) -> None:
    async def run() -> None:
        reg = CollectorRegistry()
        idx = MemoryIndex()
        tp = TokenProcessor(2)
        pool = EventPool(EventApplier(idx, tp), PoolConfig(concurrency=2), PoolMetrics(reg))
        task = asyncio.create_task(pool.run())
        await pool.started()
        try:
            for frames in messages:
                pool.workers.submit(frames, None)
            good: Any = [0.0, [["BlockStored", [7], None, [1, 2], 2, None, "GPU"]]]
            pool.workers.submit([b"kv@fresh@m", (0).to_bytes(8, "big"), msgpack.packb(good)], None)
            await pool.drain(10)
            assert reg.get_sample_value("kv_cache_events_messages_received_total") == len(messages) + 1
            assert idx.lookup_now(tp.block_keys([1, 2], "m"))["fresh"].blocks == 1
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(run())
