"""KV-cache benchmarks, side by side in one run (medians of --repeats; the box is shared and noisy).

  ingest   — block events/s on one core: msgpack decode alone, decode + apply (hash + index) through the
             pool's worker path (`ShardedWorkers.process`: seq check, decode, apply), and removals;
             batches look like vLLM's: BlockStored events of `--blocks-per-event` chained blocks.
  zmq      — the same through real sockets: a publisher *process* sends pre-encoded frames over tcp
             (PUB → our SUB → shard queue → worker → index), measured until the index holds them all.
  paced    — the serving case: one 64-block batch at a time (a 1k-token prefill's), 200/s, each waking the loop;
             main-thread CPU per batch.
  stall    — the request path while ingesting: the largest event-loop stall seen by a 1 ms ticker.
  lookup   — per request: hashing the prompt into request keys and the index lookup, 1k–32k tokens,
             8 pods, an index holding 200k blocks.
  memory   — tracemalloc bytes per (block, pod) entry, engine→request map included.
  redis    — lookup latency and ingest rate with the Redis backend next to in-memory (needs redis-server).
Run: `python -m e2e.bench.index.kvcache` (`--quick` for a smoke run).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import random
import shutil
import socket
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import msgpack
import zmq
import zmq.asyncio
from prometheus_client import CollectorRegistry

from epp.kvcache.config import PoolConfig
from epp.kvcache.events import decode_batch
from epp.kvcache.index import DEFAULT_ENGINE_RUN_SIZE, MemoryIndex
from epp.kvcache.ingest import EventApplier
from epp.kvcache.metrics import PoolMetrics
from epp.kvcache.pool import EventPool
from epp.kvcache.tokens import TokenProcessor

BS = 16
MODEL = "Qwen/Qwen2.5-0.5B-Instruct"


def median_of(repeats: int, fn: Callable[[], float]) -> float:
    return statistics.median(fn() for _ in range(repeats))


def make_payloads(n_batches: int, events_per_batch: int, blocks_per_event: int, seed: int) -> list[bytes]:
    """Chained BlockStored events (vLLM 0.34 map form), as the engine sends after prefill steps."""
    rnd = random.Random(seed)
    out = []
    h = seed << 40
    for _ in range(n_batches):
        evs = []
        for _ in range(events_per_batch):
            parent = None
            hashes = []
            for _ in range(blocks_per_event):
                h += 1
                hashes.append(h)
            toks = [rnd.randrange(150_000) for _ in range(blocks_per_event * BS)]
            evs.append(
                {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": toks,
                 "block_size": BS, "lora_id": None, "medium": "GPU", "lora_name": None}
            )  # fmt: skip
        out.append(msgpack.packb([time.time(), evs, 0]))
    return out


def removal_payloads(stored: list[bytes]) -> list[bytes]:
    out = []
    for p in stored:
        evs = msgpack.unpackb(p)[1]
        hashes = [h for e in evs for h in e["block_hashes"]]
        out.append(msgpack.packb([time.time(), [{"type": "BlockRemoved", "block_hashes": hashes, "medium": "GPU"}]]))
    return out


def new_pool(compact: bool = True) -> tuple[EventPool, MemoryIndex]:
    idx = MemoryIndex(engine_run_size=DEFAULT_ENGINE_RUN_SIZE if compact else None)
    pool = EventPool(EventApplier(idx, TokenProcessor(BS)), PoolConfig(concurrency=1), PoolMetrics(CollectorRegistry()))
    return pool, idx


def bench_ingest(args: argparse.Namespace) -> dict[str, float]:
    payloads = make_payloads(args.batches, 4, args.blocks_per_event, 1)
    removals = removal_payloads(payloads)
    blocks = args.batches * 4 * args.blocks_per_event

    def decode_only() -> float:
        t = time.perf_counter()
        for p in payloads:
            decode_batch(p)
        return blocks / (time.perf_counter() - t)

    def apply_all(compact: bool = True) -> float:
        pool, idx = new_pool(compact)

        async def go() -> float:
            t = time.perf_counter()
            for i, p in enumerate(payloads):
                await pool.workers.process("10.0.0.1:8000", MODEL, i, p, None)
            return blocks / (time.perf_counter() - t)

        r = asyncio.run(go())
        assert len(idx) == blocks
        return r

    def store_then_remove(compact: bool = True) -> float:
        pool, idx = new_pool(compact)

        async def go() -> float:
            for i, p in enumerate(payloads):
                await pool.workers.process("10.0.0.1:8000", MODEL, i, p, None)
            t = time.perf_counter()
            for i, p in enumerate(removals):
                await pool.workers.process("10.0.0.1:8000", MODEL, len(payloads) + i, p, None)
            return blocks / (time.perf_counter() - t)

        r = asyncio.run(go())
        assert len(idx) == 0
        return r

    gc.collect()
    return {
        "decode blocks/s": median_of(args.repeats, decode_only),
        "stored blocks/s (decode+hash+index)": median_of(args.repeats, apply_all),
        "removed blocks/s": median_of(args.repeats, store_then_remove),
        "dict engine maps: stored blocks/s": median_of(args.repeats, lambda: apply_all(False)),
        "dict engine maps: removed blocks/s": median_of(args.repeats, lambda: store_then_remove(False)),
    }


PUBLISHER = r"""
import sys, time, zmq, msgpack
port, n, bpe, seed, epb, rate = map(int, sys.argv[1:7])
sys.path.insert(0, ".")
from e2e.bench.index.kvcache import make_payloads
payloads = make_payloads(n, epb, bpe, seed)
ctx = zmq.Context()
pub = ctx.socket(zmq.PUB)
pub.setsockopt(zmq.SNDHWM, 0)
pub.connect(f"tcp://127.0.0.1:{port}")
time.sleep(0.5)
t0 = time.perf_counter()
for i, p in enumerate(payloads):
    if rate:  # paced: one batch at a time, as an engine publishes after its steps
        time.sleep(max(0.0, t0 + i / rate - time.perf_counter()))
    pub.send_multipart([b"kv@10.0.0.9:8000@m", i.to_bytes(8, "big"), p])
time.sleep(1)
pub.close(linger=2000)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def central_pool() -> tuple[int, MemoryIndex, EventPool, asyncio.Task[None]]:
    """A running pool bound centrally on a free port, accepting any topic (the publisher is no pool endpoint)."""
    port = free_port()
    idx = MemoryIndex()
    cfg = PoolConfig(zmq_endpoint=f"tcp://127.0.0.1:{port}", concurrency=2, queue_size=100_000, discover_pods=False)
    pool = EventPool(EventApplier(idx, TokenProcessor(BS)), cfg, PoolMetrics(CollectorRegistry()))
    pool.workers.known_pods = None
    task = asyncio.create_task(pool.run())
    await pool.started()
    return port, idx, pool, task


def bench_zmq(args: argparse.Namespace) -> dict[str, float]:
    """Publisher in another process → tcp → our central SUB → worker → index; plus the event-loop stall."""

    async def idle_stalls(seconds: float) -> list[float]:
        out: list[float] = []
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            t = time.perf_counter()
            await asyncio.sleep(0.001)
            out.append(time.perf_counter() - t - 0.001)
        return sorted(out)

    async def run() -> tuple[float, ...]:
        base = await idle_stalls(1.0)
        port, idx, pool, task = await central_pool()
        item_times: list[float] = []
        real = pool.workers.process

        async def timed(*a: Any) -> None:
            t = time.perf_counter()
            await real(*a)
            item_times.append(time.perf_counter() - t)

        pool.workers.process = timed  # type: ignore[method-assign, assignment]
        stalls: list[float] = []
        stop = asyncio.Event()

        async def ticker() -> None:
            while not stop.is_set():
                t = time.perf_counter()
                await asyncio.sleep(0.001)
                stalls.append(time.perf_counter() - t - 0.001)

        tick = asyncio.create_task(ticker())
        blocks = args.batches * 4 * args.blocks_per_event
        proc = subprocess.Popen(
            [sys.executable, "-c", PUBLISHER, str(port), str(args.batches), str(args.blocks_per_event), "7", "4", "0"]
        )
        try:
            while len(idx) == 0:
                await asyncio.sleep(0.0005)
            t0 = time.perf_counter()
            while len(idx) < blocks:
                await asyncio.sleep(0.001)
                if time.perf_counter() - t0 > 60:
                    raise TimeoutError(f"only {len(idx)} of {blocks} blocks arrived")
            rate = blocks / (time.perf_counter() - t0)
        finally:
            stop.set()
            await tick
            proc.wait(30)
            task.cancel()
        stalls.sort()
        item_times.sort()
        q = 0.99
        return (
            rate,
            stalls[int(len(stalls) * q)] * 1e3,
            stalls[-1] * 1e3,
            base[int(len(base) * q)] * 1e3,
            base[-1] * 1e3,
            item_times[-1] * 1e3,
            item_times[len(item_times) // 2] * 1e3,
            item_times[int(len(item_times) * q)] * 1e3,
        )

    runs = [asyncio.run(run()) for _ in range(max(1, args.repeats // 2))]
    col = lambda i: statistics.median(r[i] for r in runs)  # noqa: E731
    return {
        "zmq end-to-end blocks/s": col(0),
        "loop stall p99 during ingest (ms)": col(1),
        "loop stall max during ingest (ms)": col(2),
        "loop stall p99 idle, same box (ms)": col(3),
        "loop stall max idle, same box (ms)": col(4),
        "worker step median (ms; one 128-block batch)": col(6),
        "worker step p99 (ms)": col(7),
        "worker step max (ms)": col(5),
    }


def populate(idx: Any, tp: TokenProcessor, pods: list[str], n_blocks: int, prompt: list[int]) -> None:
    """Each pod holds a different-length prefix of `prompt`, plus unrelated chains up to n_blocks total."""
    rnd = random.Random(3)
    n = len(prompt) // BS
    keys = tp.block_keys(prompt, MODEL)
    e = 1 << 50
    for i, pod in enumerate(pods):
        k = keys[: n * (i + 1) // len(pods)]
        idx.add(list(range(e, e + len(k))), k, pod, 0)
        e += len(k)
    filler = n_blocks - sum(n * (i + 1) // len(pods) for i in range(len(pods)))
    while filler > 0:
        m = min(filler, 256)
        toks = [rnd.randrange(150_000) for _ in range(m * BS)]
        idx.add(list(range(e, e + m)), tp.block_keys(toks, MODEL), pods[filler % len(pods)], 0)
        e += m
        filler -= m


def bench_paced(rate: int = 200, batches: int = 1000, blocks: int = 64, repeats: int = 3) -> dict[str, float]:
    """The serving case: one small batch at a time (one BlockStored of `blocks` blocks, as a 1k-token prefill
    publishes), paced at `rate` batches/s, so every batch wakes the loop on its own. Main-thread CPU per batch
    (receive, queue, decode, seq check, apply), net of the same loop's idle CPU over the same time."""

    async def run() -> float:
        port, idx, _pool, task = await central_pool()
        proc = subprocess.Popen(
            [sys.executable, "-c", PUBLISHER, str(port), str(batches), str(blocks), "11", "1", str(rate)]
        )
        try:
            while len(idx) == 0:
                await asyncio.sleep(0.001)
            c0, t0 = time.thread_time(), time.perf_counter()
            while len(idx) < batches * blocks:
                await asyncio.sleep(0.05)
                if time.perf_counter() - t0 > 120:
                    raise TimeoutError(f"only {len(idx)} of {batches * blocks} blocks arrived")
            busy, wall = time.thread_time() - c0, time.perf_counter() - t0
            c1 = time.thread_time()
            await asyncio.sleep(min(wall, 2.0))
            idle = (time.thread_time() - c1) * wall / min(wall, 2.0)
        finally:
            proc.wait(30)
            task.cancel()
        return (busy - idle) / (batches - 1) * 1e6

    runs = [asyncio.run(run()) for _ in range(repeats)]
    return {f"main-thread CPU per paced batch ({blocks} blocks, {rate}/s), µs": statistics.median(runs)}


def bench_receive(rate: int = 200, n: int = 1000, repeats: int = 3) -> dict[str, float]:
    """Receiving alone (nothing decoded or applied), one small batch at a time at `rate`/s, each waking the loop:
    the pool's receive loop (a drain on each wake-up of the socket's FD) against a plain zmq.asyncio
    `recv_multipart` loop (the pool's before 2026-12-04). Main-thread CPU per message, first message to last,
    median of `repeats` (the idle loop's wake-ups between messages included in both)."""

    def publisher(port: int) -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "-c", PUBLISHER, str(port), str(n), "1", "3", "1", str(rate)])

    async def pool_loop() -> float:
        port, _idx, pool, task = await central_pool()
        got: list[float] = []

        def count(frames: list[bytes], source_pod: str | None, replay: str | None = None) -> bool:
            got.append(time.thread_time())
            return True

        pool.workers.submit = count  # type: ignore[method-assign]
        proc = publisher(port)
        try:
            while len(got) < n:
                await asyncio.sleep(0.05)
        finally:
            proc.wait(30)
            task.cancel()
        return (got[-1] - got[0]) / (n - 1) * 1e6

    async def asyncio_loop() -> float:
        ctx = zmq.asyncio.Context()
        sock = ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        port = sock.bind_to_random_port("tcp://127.0.0.1")
        proc = publisher(port)
        try:
            await sock.recv_multipart()
            c0 = time.thread_time()
            for _ in range(n - 1):
                await sock.recv_multipart()
            return (time.thread_time() - c0) / (n - 1) * 1e6
        finally:
            proc.wait(30)
            sock.close(linger=0)

    ours, plain = [], []
    for _ in range(repeats):
        ours.append(asyncio.run(pool_loop()))
        plain.append(asyncio.run(asyncio_loop()))
    return {
        f"receive per message, the pool's loop ({rate}/s), µs": statistics.median(ours),
        f"receive per message, zmq.asyncio recv_multipart ({rate}/s), µs": statistics.median(plain),
    }


def bench_lookup(args: argparse.Namespace) -> list[tuple[int, float, float, float]]:
    tp = TokenProcessor(BS)
    pods = [f"10.0.0.{i}:8000" for i in range(8)]
    rnd = random.Random(5)
    rows = []
    for ntok in args.lengths:
        prompt = [rnd.randrange(150_000) for _ in range(ntok)]
        idx = MemoryIndex()
        populate(idx, tp, pods, args.index_blocks, prompt)
        keys = tp.block_keys(prompt, MODEL)
        res = idx.lookup_now(keys, pods)
        assert res[pods[-1]].blocks == len(keys), res

        def hashing(prompt: list[int] = prompt) -> float:
            t = time.perf_counter()
            for _ in range(20):
                tp.block_keys(prompt, MODEL)
            return (time.perf_counter() - t) / 20 * 1e6

        def lookup(keys: list[int] = keys, idx: MemoryIndex = idx) -> float:
            t = time.perf_counter()
            for _ in range(20):
                idx.lookup_now(keys, pods)
            return (time.perf_counter() - t) / 20 * 1e6

        h = median_of(args.repeats, hashing)
        lk = median_of(args.repeats, lookup)
        rows.append((ntok, h, lk, h + lk))
    return rows


def bench_memory(args: argparse.Namespace) -> dict[str, float]:
    """Bytes per (block, pod) entry: unique blocks on one pod each, and one prefix shared by 4 pods."""
    tp = TokenProcessor(BS)
    rnd = random.Random(9)
    n = args.memory_blocks
    chains = [[rnd.randrange(150_000) for _ in range(256 * BS)] for _ in range(n // 256)]
    keysets = [tp.block_keys(c, MODEL) for c in chains]
    out = {}
    cases = [(f"{c}, {ppb} pod(s) per block", ppb, c) for c in ("compact (default)", "dict") for ppb in (1, 4)]
    for label, pods_per_block, kind in cases:
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        idx = MemoryIndex(engine_run_size=None if kind == "dict" else DEFAULT_ENGINE_RUN_SIZE)
        e = 1 << 50
        for ks in keysets:
            for p in range(pods_per_block):
                # engine keys differ per pod (vLLM without PYTHONHASHSEED); the request keys are shared
                idx.add(list(range(e, e + len(ks))), ks, f"10.0.0.{p}:8000", 0)
                e += len(ks)
        after = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        entries = len(keysets) * 256 * pods_per_block
        out[f"bytes/entry, {label}"] = (after - before) / entries
        del idx
    return out


def bench_redis(args: argparse.Namespace) -> dict[str, float] | None:
    exe = shutil.which("redis-server")
    if exe is None:
        return None
    from epp.kvcache.redis_index import RedisIndex

    port = free_port()
    proc = subprocess.Popen(
        [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    try:
        time.sleep(0.3)
        tp = TokenProcessor(BS)
        pods = [f"10.0.0.{i}:8000" for i in range(8)]
        prompt = [random.Random(2).randrange(150_000) for _ in range(512 * BS)]
        keys = tp.block_keys(prompt, MODEL)

        async def go() -> dict[str, float]:
            r = RedisIndex(f"redis://127.0.0.1:{port}/0")
            m = MemoryIndex()
            for idx in (r, m):
                populate(idx, tp, pods, 20_000, prompt)
            await r.flush()
            out = {}
            for name, idx in (("memory", m), ("redis", r)):
                ts = []
                for _ in range(args.repeats * 5):
                    t = time.perf_counter()
                    res = await idx.lookup(keys, pods)
                    ts.append((time.perf_counter() - t) * 1e6)
                assert res[pods[-1]].blocks == 512
                out[f"lookup 512 blocks, {name} (µs)"] = statistics.median(ts)
            payloads = make_payloads(200, 4, args.blocks_per_event, 11)
            for name, idx in (("memory", MemoryIndex()), ("redis", RedisIndex(f"redis://127.0.0.1:{port}/1"))):
                pool = EventPool(EventApplier(idx, tp), PoolConfig(concurrency=1), PoolMetrics(CollectorRegistry()))
                t = time.perf_counter()
                for i, p in enumerate(payloads):
                    await pool.workers.process("10.0.0.1:8000", MODEL, i, p, None)
                out[f"stored blocks/s, {name}"] = 200 * 4 * args.blocks_per_event / (time.perf_counter() - t)
            await r.close()
            return out

        return asyncio.run(go())
    finally:
        proc.terminate()
        proc.wait(5)


def bench_pause(n: int = 1_000_000, repeats: int = 3) -> dict[str, float]:
    """The longest single engine-map call (spill or merge slice) over n stores then n removals in batches of
    32, one pod. The sequence is deterministic, so call i does the same work in every repeat: the elementwise
    minimum over `repeats` of each call's wall time is that call's own cost with the box's preemptions and steal
    (which land on different calls each time) taken out, and its maximum is the structural worst pause. The raw
    worst wall and thread-CPU times of one pass are printed beside it."""
    import numpy as np

    from epp.kvcache.index import EngineMap

    out = {}
    for label, make in (
        ("default", lambda: EngineMap()),
        ("one-shot 65,536 spill (old)", lambda: EngineMap(65536, step=1 << 30)),
    ):
        rnd = random.Random(1)
        keys = [rnd.getrandbits(64) for _ in range(n)]
        batches = [keys[i : i + 32] for i in range(0, n, 32)]
        per_call = np.full(n + len(batches), np.inf)
        worst_wall = worst_cpu = 0.0
        left = 0.0
        for _ in range(repeats):
            m = make()
            times = np.empty(n + len(batches))
            clock, cpu = time.perf_counter, time.thread_time
            gc.collect()
            gc.disable()  # a cyclic GC pass is the interpreter's pause, not the map's
            try:
                for i, e in enumerate(keys):
                    t, c = clock(), cpu()
                    m[e] = 7
                    times[i] = clock() - t
                    worst_cpu = max(worst_cpu, cpu() - c)
                for j, b in enumerate(batches):
                    t, c = clock(), cpu()
                    m.delete_many(b)
                    times[n + j] = clock() - t
                    worst_cpu = max(worst_cpu, cpu() - c)
            finally:
                gc.enable()
            worst_wall = max(worst_wall, float(times.max()))
            np.minimum(per_call, times, out=per_call)
            left = float(len(m.runs))
        k = int(per_call.argmax())
        out[f"{label}: worst call, wall ms (any pass)"] = worst_wall * 1e3
        out[f"{label}: worst call, thread CPU ms (any pass)"] = worst_cpu * 1e3
        out[f"{label}: structural worst call, ms (min of {repeats})"] = float(per_call[k]) * 1e3
        out[f"{label}: ... it is a {'store' if k < n else 'removal batch'} (call {k:,})"] = float(k)
        out[f"{label}: calls over 1 ms (min of {repeats})"] = float((per_call > 1e-3).sum())
        out[f"{label}: runs left after all removed"] = left
    return out


def bench_speculative(n: int = 3000, repeats: int = 7) -> dict[str, float]:
    """A request's speculative-entry work on the in-memory index, with 20 requests' entries live (10 req/s, the
    producer's 2 s TTL; the index's clock is stepped 0.1 s per request): a 64-block lookup alone, and lookup +
    speculative write + the expiry of an old request's entries, picked on a pod that does not hold the prompt and
    on the one whose events put it there. Thread CPU µs per request, median of `repeats`."""
    import epp.kvcache.index as index_module
    from epp.kvcache.index import TIER_GPU, MemoryIndex

    rnd = random.Random(1)
    tp = TokenProcessor(16)
    prefix = [rnd.randrange(150_000) for _ in range(512)]
    keys = [tp.block_keys(prefix + [rnd.randrange(150_000) for _ in range(512)], MODEL) for _ in range(8)]
    pods = [f"10.0.0.{i}:8000" for i in range(4)]
    idx = MemoryIndex()
    for i, k in enumerate(keys):
        idx.add(None, k, pods[i % 4], TIER_GPU)
    clock = [1000.0]

    class SteppedTime:
        @staticmethod
        def monotonic() -> float:
            return clock[0]

    def picked(offset: int) -> Callable[[int], None]:
        """A request picked `offset` pods from the one holding its prompt: 1, every block is written and later
        expired; 0, where its events put the prompt, nothing is written (since 2026-12-04)."""

        def request(i: int) -> None:
            clock[0] += 0.1
            idx.lookup_now(keys[i % 8], pods)
            idx.add_speculative(keys[i % 8], pods[(i + offset) % 4], 2.0)

        return request

    request, warm = picked(1), picked(0)

    def lookup(i: int) -> None:
        idx.lookup_now(keys[i % 8], pods)

    def per_request(fn: Callable[[int], None]) -> float:
        runs = []
        for _ in range(repeats):
            c = time.thread_time()
            for i in range(n):
                fn(i)
            runs.append((time.thread_time() - c) / n * 1e6)
        return statistics.median(runs)

    def new_keys() -> tuple[float, float]:
        """Picks of 64 keys never seen (most picks of a real workload), on 4 pods in turn, held for an hour:
        tracemalloc bytes per speculative entry, and µs of thread CPU to write one pick (untraced)."""
        picks = [[rnd.getrandbits(63) for _ in range(64)] for _ in range(n)]
        fresh = MemoryIndex()
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        for i, k in enumerate(picks):
            fresh.add_speculative(k, pods[i % 4], 3600.0)
        size = (tracemalloc.get_traced_memory()[0] - before) / (64 * n)
        tracemalloc.stop()
        runs = []
        for _ in range(repeats):
            fresh = MemoryIndex()
            c = time.thread_time()
            for i, k in enumerate(picks):
                fresh.add_speculative(k, pods[i % 4], 3600.0)
            runs.append((time.thread_time() - c) / n * 1e6)
        return size, statistics.median(runs)

    saved = index_module.time
    index_module.time = SteppedTime  # type: ignore[assignment]
    try:
        for i in range(100):
            request(i)
        size, write = new_keys()
        return {
            "64-block lookup, 20 requests' entries live (µs)": per_request(lookup),
            "lookup + speculative write + expiry (µs)": per_request(request),
            "the same, picked where the prompt is cached (µs)": per_request(warm),
            "write a pick of 64 new keys (µs)": write,
            "bytes per speculative entry (new keys)": size,
        }
    finally:
        index_module.time = saved


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--batches", type=int, default=2000)
    ap.add_argument("--blocks-per-event", type=int, default=32)
    ap.add_argument("--lengths", type=int, nargs="*", default=[1024, 4096, 8192, 16384, 32768])
    ap.add_argument("--index-blocks", type=int, default=200_000)
    ap.add_argument("--memory-blocks", type=int, default=200_000)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.repeats, args.batches, args.index_blocks, args.memory_blocks = 2, 200, 20_000, 20_000
    print(f"python {sys.version.split()[0]}, block size {BS}, {args.blocks_per_event} blocks per BlockStored event")
    print("\n# ingest (one core, in process)")
    for k, v in bench_ingest(args).items():
        print(f"  {k:45s} {v:>12,.0f}")
    print("\n# zmq end to end (publisher process → tcp → SUB → worker → index) and request-path stall")
    for k, v in bench_zmq(args).items():
        print(f"  {k:45s} {v:>12,.2f}")
    for k, v in bench_receive(n=200 if args.quick else 1000, repeats=args.repeats // 2 or 1).items():
        print(f"  {k:45s} {v:>12,.1f}")
    for blocks in (1, 64):  # a warm request's recomputed last block, a 1k-token prefill
        for k, v in bench_paced(
            batches=200 if args.quick else 1000, blocks=blocks, repeats=args.repeats // 2 or 1
        ).items():
            print(f"  {k:45s} {v:>12,.1f}")
    print(f"\n# lookup (8 pods, index of {args.index_blocks:,} blocks): median µs per request")
    print(f"  {'tokens':>7} {'blocks':>7} {'hash µs':>9} {'lookup µs':>10} {'total µs':>9}")
    for ntok, h, lk, tot in bench_lookup(args):
        print(f"  {ntok:>7} {ntok // BS:>7} {h:>9.0f} {lk:>10.0f} {tot:>9.0f}")
    print("\n# memory (tracemalloc; engine→request map included; compact = sorted uint64 runs, the default)")
    for k, v in bench_memory(args).items():
        print(f"  {k:45s} {v:>12.1f}")
    print("\n# engine-map pauses (1M stores then 1M removals in batches of 32, one pod)")
    for k, v in bench_pause(200_000 if args.quick else 1_000_000).items():
        print(f"  {k:45s} {v:>12.2f}")
    print("\n# speculative entries (in-memory index, 20 requests' entries live)")
    for k, v in bench_speculative().items():
        print(f"  {k:45s} {v:>12.1f}")
    red = bench_redis(args)
    print("\n# redis vs in-memory")
    if red is None:
        print("  redis-server not found")
    else:
        for k, v in red.items():
            print(f"  {k:45s} {v:>12,.0f}")
        lk = red["lookup 512 blocks, redis (µs)"] / red["lookup 512 blocks, memory (µs)"]
        ing = red["stored blocks/s, memory"] / red["stored blocks/s, redis"]
        print(f"  ratio: lookup redis/memory {lk:.1f}x, ingest memory/redis {ing:.1f}x")


if __name__ == "__main__":
    main()
