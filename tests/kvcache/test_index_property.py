"""Property: whatever the interleaving of stores, removals, clears, lost messages, publisher restarts and
replays, once the next message of each pod arrives the index equals one rebuilt from the blocks the
engines still hold."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from typing import Any

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from epp.kvcache.config import PoolConfig
from epp.kvcache.index import TIER_GPU, MemoryIndex
from epp.kvcache.ingest import EventApplier
from epp.kvcache.metrics import PoolMetrics
from epp.kvcache.redis_index import RedisIndex
from epp.kvcache.replay import END_SEQ, Replayer
from epp.kvcache.tokens import TokenProcessor
from epp.kvcache.workers import Resync, ShardedWorkers

BS = 4
MODEL = "m"
PODS = ("10.0.0.1:8000", "10.0.0.2:8000")
_uniq = itertools.count(1)


class Engine:
    """A vLLM-like engine: a block cache (hash → (parent, tokens)), a seq counter and a replay buffer."""

    def __init__(self, pod: str, map_encoding: bool) -> None:
        self.pod = pod
        self.map = map_encoding
        self.blocks: dict[int, tuple[int | None, list[int]]] = {}
        self.seq = 0
        self.buffer: list[tuple[int, bytes]] = []
        self.ts = 0.0

    def publish(self, events: list[Any]) -> tuple[int, bytes]:
        self.ts += 1.0
        payload = msgpack.packb([self.ts, events, None])
        msg = (self.seq, payload)
        self.buffer.append(msg)
        self.seq += 1
        return msg

    def store(self, parent_pick: int, n: int) -> tuple[int, bytes]:
        cached = sorted(self.blocks)
        parent = None if not cached or parent_pick % (len(cached) + 1) == 0 else cached[parent_pick % len(cached)]
        hashes, tokens = [], []
        p = parent
        for _ in range(n):
            h = next(_uniq) * 7919 + (1 << 62)
            toks = [next(_uniq) for _ in range(BS)]
            self.blocks[h] = (p, toks)
            hashes.append(h)
            tokens += toks
            p = h
        if self.map:
            ev: Any = {
                "type": "BlockStored",
                "block_hashes": hashes,
                "parent_block_hash": parent,
                "token_ids": tokens,
                "block_size": BS,
                "lora_id": None,
                "medium": "GPU",
                "lora_name": None,
            }
        else:
            ev = ["BlockStored", hashes, parent, tokens, BS, None, "GPU", None]
        return self.publish([ev])

    def remove(self, picks: list[int]) -> tuple[int, bytes]:
        cached = sorted(self.blocks)
        gone = sorted({cached[i % len(cached)] for i in picks}) if cached else []
        for h in gone:
            del self.blocks[h]
        ev = {"type": "BlockRemoved", "block_hashes": gone, "medium": "GPU"} if self.map else ["BlockRemoved", gone]
        return self.publish([ev])

    def clear(self) -> tuple[int, bytes]:
        self.blocks.clear()
        return self.publish([{"type": "AllBlocksCleared"} if self.map else ["AllBlocksCleared"]])

    def restart(self) -> None:
        self.blocks.clear()
        self.seq = 0
        self.buffer = []

    def prefix_tokens(self, h: int) -> list[int] | None:
        """Tokens from the root to block h, or None if an ancestor's content is unknown to the engine."""
        out: list[list[int]] = []
        cur: int | None = h
        while cur is not None:
            node = self.blocks.get(cur) or self.history.get(cur)
            if node is None:
                return None
            out.append(node[1])
            cur = node[0]
        return [t for blk in reversed(out) for t in blk]

    history: dict[int, tuple[int | None, list[int]]] = {}


class SimReplayer(Replayer):
    """Replays from the simulated engines' buffers instead of a ROUTER socket."""

    engines: dict[str, Engine]

    async def frames(self, endpoint: str, start: int) -> AsyncIterator[list[bytes]]:
        eng = self.engines[endpoint]
        for seq, payload in list(eng.buffer):
            if seq >= start:
                yield [b"kv@x@m", seq.to_bytes(8, "big"), payload]
        yield [b"", END_SEQ, b""]


op = st.one_of(
    st.tuples(st.just("store"), st.integers(0, 1), st.integers(0, 50), st.integers(1, 4)),
    st.tuples(st.just("remove"), st.integers(0, 1), st.lists(st.integers(0, 50), min_size=1, max_size=3)),
    st.tuples(st.just("clear"), st.integers(0, 1)),
    st.tuples(st.just("restart"), st.integers(0, 1)),
)


OPS = st.lists(st.tuples(op, st.booleans()), min_size=1, max_size=30)
MAPS = st.tuples(st.booleans(), st.booleans())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS, maps=MAPS)
def test_index_converges_to_surviving_blocks(ops: list[tuple[Any, bool]], maps: tuple[bool, bool]) -> None:
    asyncio.run(_run(ops, maps, None))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS, maps=MAPS)
def test_compact_engine_maps_converge_too(ops: list[tuple[Any, bool]], maps: tuple[bool, bool]) -> None:
    asyncio.run(_run(ops, maps, None, engine_run_size=3))


_prefixes = itertools.count()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS, maps=MAPS)
def test_redis_index_converges_too(redis_url: str, ops: list[tuple[Any, bool]], maps: tuple[bool, bool]) -> None:
    asyncio.run(_run(ops, maps, redis_url))


async def _run(
    ops: list[tuple[Any, bool]], maps: tuple[bool, bool], redis_url: str | None, engine_run_size: int = 65536
) -> None:
    tp = TokenProcessor(BS, "seed")
    index: Any = (
        MemoryIndex(engine_run_size=engine_run_size)
        if redis_url is None
        else RedisIndex(redis_url, prefix=f"prop{next(_prefixes)}:")
    )
    try:
        await _drive(tp, index, ops, maps)
    finally:
        if redis_url is not None:
            await index.close()


async def _drive(tp: TokenProcessor, index: Any, ops: list[tuple[Any, bool]], maps: tuple[bool, bool]) -> None:
    pool = ShardedWorkers(EventApplier(index, tp), PoolConfig(concurrency=2), PoolMetrics(CollectorRegistry()))
    replayer = SimReplayer(pool.cfg, pool.seq, pool, pool.metrics)
    pool.replayer = replayer
    engines = {pod: Engine(pod, maps[i]) for i, pod in enumerate(PODS)}
    replayer.engines = {f"sim://{pod}": e for pod, e in engines.items()}
    Engine.history = {}

    async def deliver(pod: str, msg: tuple[int, bytes]) -> None:
        await pool.process(pod, MODEL, msg[0], msg[1], f"sim://{pod}")

    for (kind, which, *args), delivered in ops:
        pod = PODS[which]
        eng = engines[pod]
        if kind == "restart":
            eng.restart()
            # the SUB sees the TCP link drop and come back: a proactive resync request
            await pool.process_resync(Resync(pod, f"sim://{pod}", ()))
            continue
        if kind == "store":
            msg = eng.store(args[0], args[1])
            Engine.history.update(eng.blocks)
        elif kind == "remove":
            msg = eng.remove(args[0])
        else:
            msg = eng.clear()
        if delivered:
            await deliver(pod, msg)
    for pod, eng in engines.items():  # the next message of each pod is delivered
        await deliver(pod, eng.publish([]))

    expected: set[tuple[int, str, int]] = set()
    for pod, eng in engines.items():
        for h in eng.blocks:
            toks = eng.prefix_tokens(h)
            assert toks is not None
            expected.add((tp.block_keys(toks, MODEL)[-1], pod, TIER_GPU))
    if isinstance(index, RedisIndex):
        await index.flush()
        assert await index.entries() == expected
    else:
        index.maintain()
        assert index.entries() == expected
