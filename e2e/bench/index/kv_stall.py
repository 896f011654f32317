"""How long one huge KV-event batch holds the event loop (issue 15: one 131,072-block batch stalled requests).

A real vLLM-shaped payload (msgpack `[ts, [["BlockStored", hashes, parent, token_ids, block_size, ...]], rank]`)
goes through `ShardedWorkers.process`, the path every ZMQ message takes after `submit` (seq check, decode, apply to
the in-memory index, release), while a 1 ms ticker on the same loop records how late it wakes: the longest wait is
what a request arriving then would wait. It also records the thread's CPU time between two ticks: the longest is the
work the loop did without yielding, free of the time the OS gave to other processes. The same ticker then runs as
long next to CPU-bound work that yields every ~0.3 ms: its longest wait is the box's own noise (2 shared cores: a
busy process is preempted for tens of ms under load), quoted next to it. `--whole` also runs the batch the way it
was before slicing (`whole`: one `decode_batch`, one `apply`) and before the stepped decode (`decode-whole`: one
`decode_batch`, then the sliced apply), interleaved in the same run.

    python -m e2e.bench.index.kv_stall [--blocks 131072] [--block-size 16] [--repeats 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence

import msgpack
from prometheus_client import CollectorRegistry

from epp.kvcache.config import PoolConfig
from epp.kvcache.events import decode_batch
from epp.kvcache.index import MemoryIndex
from epp.kvcache.ingest import EventApplier
from epp.kvcache.metrics import PoolMetrics
from epp.kvcache.tokens import TokenProcessor
from epp.kvcache.workers import ShardedWorkers


def payload(blocks: int, block_size: int, seed: int) -> bytes:
    hashes = list(range(seed * 10**9, seed * 10**9 + blocks))
    tokens = [(i * 7919 + seed) % 151_000 for i in range(blocks * block_size)]
    return msgpack.packb([time.time(), [["BlockStored", hashes, None, tokens, block_size, None, "GPU", None]], 0])


async def _ticked(
    work: Callable[[], Awaitable[None]] | None, seconds: float, cpu: list[float] | None = None
) -> tuple[list[float], float]:
    """Ticker lateness (s) while `work` runs (or for `seconds` when None), and how long the work took; `cpu` gets
    the thread's CPU time between two ticks (what the loop itself spent, without the time the OS took it away)."""
    late: list[float] = []
    stop = asyncio.Event()

    async def ticker() -> None:
        while not stop.is_set():
            t = time.perf_counter()
            c = time.thread_time()
            await asyncio.sleep(0.001)
            late.append(time.perf_counter() - t - 0.001)
            if cpu is not None:
                cpu.append(time.thread_time() - c)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0.05)
    late.clear()
    t0 = time.perf_counter()
    if work is None:
        await asyncio.sleep(seconds)
    else:
        await work()
    took = time.perf_counter() - t0
    await asyncio.sleep(0.005)
    stop.set()
    await task
    return sorted(late), took


def run_once(data: bytes, block_size: int, mode: str) -> dict[str, float]:
    async def main() -> dict[str, float]:
        pool = ShardedWorkers(
            EventApplier(MemoryIndex(), TokenProcessor(block_size)), PoolConfig(concurrency=1),
            PoolMetrics(CollectorRegistry()),
        )  # fmt: skip

        async def sliced() -> None:
            await pool.process("pod", "m", 0, data, None)

        async def one_piece() -> None:
            pool.applier.apply("pod", "m", decode_batch(data))

        async def decode_whole() -> None:  # before this change: one-piece decode, sliced apply
            await pool.apply_sliced("pod", "m", decode_batch(data))

        async def busy() -> None:  # CPU-bound like the apply, in ~0.3 ms steps: what the box's scheduler adds
            end = time.perf_counter() + took
            while time.perf_counter() < end:
                sum(range(20_000))
                await asyncio.sleep(0)

        work = {"sliced": sliced, "whole": one_piece, "decode-whole": decode_whole}[mode]
        cpu: list[float] = []
        late, took = await _ticked(work, 0, cpu)
        cpu.sort()
        idle, _ = await _ticked(busy, 0)
        q = lambda xs, p: xs[min(len(xs) - 1, int(len(xs) * p))] * 1e3  # noqa: E731
        return {
            "apply_ms": took * 1e3,
            "stall_max_ms": late[-1] * 1e3,
            "cpu_max_ms": cpu[-1] * 1e3,
            "stall_p99_ms": q(late, 0.99),
            "idle_max_ms": idle[-1] * 1e3,
            "idle_p99_ms": q(idle, 0.99),
        }

    return asyncio.run(main())


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m e2e.bench.index.kv_stall")
    p.add_argument("--blocks", type=int, default=131_072)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument(
        "--whole",
        action="store_true",
        help="also the one-piece decode+apply, and the one-piece decode "
        "with the sliced apply (the code before stepped decoding), interleaved in the same run",
    )
    ns = p.parse_args(argv)
    data = payload(ns.blocks, ns.block_size, 1)
    print(f"payload: {len(data) / 2**20:.1f} MiB, {ns.blocks} blocks of {ns.block_size} tokens")
    modes = ["sliced", "decode-whole", "whole"] if ns.whole else ["sliced"]
    rows: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    for _ in range(ns.repeats):
        for m in modes:
            rows[m].append(run_once(data, ns.block_size, m))
    for m in modes:
        med = {k: statistics.median(r[k] for r in rows[m]) for k in rows[m][0]}
        print(
            f"{m:12} (median of {ns.repeats}): apply {med['apply_ms']:.0f} ms; "
            f"loop stall max {med['stall_max_ms']:.1f} ms (CPU {med['cpu_max_ms']:.1f} ms) "
            f"p99 {med['stall_p99_ms']:.1f} ms | busy 0.3 ms steps, same box: max {med['idle_max_ms']:.1f} ms "
            f"p99 {med['idle_p99_ms']:.1f} ms | per-run stall max: "
            + ", ".join(f"{r['stall_max_ms']:.0f}" for r in rows[m])
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
