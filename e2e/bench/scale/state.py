"""Where `epp serve --workers N` should keep its one KV index: a copy in every worker (the parent ingests the events
once and fans the applied changes out) or one state process that every pick queries over a Unix socket.

Measured on the same index (`--pods` pods, `--blocks` (block, pod) entries, a prompt of `--prompt-blocks` blocks
cached to a different depth on each pod):
- a pick's lookup in process (`lookup_now`), and the same lookup as a round trip to a state process (msgpack over a
  Unix socket, asyncio on both ends; the state process answers for every pod), with 1 and 2 querying processes at
  once: wall time a query, and the querying side's CPU a query (what a worker's loop pays instead of the lookup);
- the index's memory in one process (tracemalloc), which a copy per worker multiplies by N;
- the CPU to apply one stored block to an index, which a copy per worker pays N times.

    python -m e2e.bench.scale.state --pods 256 --blocks 400000 --queries 3000
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import random
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Sequence
from typing import Any

import msgpack

from epp.kvcache.index import MemoryIndex
from epp.kvcache.tokens import TokenProcessor

BS = 16
MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
_LEN = struct.Struct(">I")


def build(pods: Sequence[str], blocks: int, prompt_blocks: int) -> tuple[MemoryIndex, list[int]]:
    """The prompt cached to a different depth on 8 of the pods (a shared prefix is on a few, not on all), then unrelated
    64-block chains spread over every pod up to `blocks` entries."""
    tp = TokenProcessor(BS)
    rnd = random.Random(7)
    prompt = [rnd.randrange(150_000) for _ in range(prompt_blocks * BS)]
    keys = tp.block_keys(prompt, MODEL)
    idx = MemoryIndex()
    e = 1 << 50
    n = 0
    holders = pods[:: max(1, len(pods) // 8)][:8]
    for i, pod in enumerate(holders):
        k = keys[: 1 + (len(keys) - 1) * i // max(1, len(holders) - 1)]
        idx.add(list(range(e, e + len(k))), k, pod, 0)
        e += len(k)
        n += len(k)
    chain = 0
    while n < blocks:
        m = min(64, blocks - n)
        fake = [rnd.getrandbits(63) for _ in range(m)]
        idx.add(list(range(e, e + m)), fake, pods[chain % len(pods)], 0)
        e, n, chain = e + m, n + m, chain + 1
    return idx, keys


async def serve(path: str, idx: MemoryIndex) -> None:
    async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                (n,) = _LEN.unpack(await reader.readexactly(4))
                keys = msgpack.unpackb(await reader.readexactly(n))
                res = idx.lookup_now(keys, None)
                out = msgpack.packb({p: (m.blocks, m.weighted) for p, m in res.items()})
                writer.write(_LEN.pack(len(out)) + out)
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_unix_server(one, path)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


async def query(path: str, keys: list[int], n: int) -> tuple[list[float], float]:
    reader, writer = await asyncio.open_unix_connection(path)
    req = msgpack.packb(keys)
    framed = _LEN.pack(len(req)) + req
    walls = []
    cpu0 = time.thread_time()
    for _ in range(n):
        t = time.perf_counter()
        writer.write(framed)
        (m,) = _LEN.unpack(await reader.readexactly(4))
        msgpack.unpackb(await reader.readexactly(m))
        walls.append(time.perf_counter() - t)
    cpu = (time.thread_time() - cpu0) / n
    writer.close()
    return walls, cpu


def pct(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m e2e.bench.scale.state", description=__doc__.split("\n\n")[0])
    p.add_argument("--pods", type=int, default=256)
    p.add_argument("--blocks", type=int, default=400_000)
    p.add_argument("--prompt-blocks", type=int, default=64)
    p.add_argument("--queries", type=int, default=3000)
    p.add_argument("--serve", help=argparse.SUPPRESS)
    p.add_argument("--client", help=argparse.SUPPRESS)
    ns = p.parse_args(argv)
    pods = [f"10.0.{i // 250}.{i % 250}:8000" for i in range(ns.pods)]
    if ns.serve:
        idx, _ = build(pods, ns.blocks, ns.prompt_blocks)
        asyncio.run(serve(ns.serve, idx))
        return 0
    if ns.client:
        _, keys = build(pods[:1], 0, ns.prompt_blocks)
        walls, cpu = asyncio.run(query(ns.client, keys, ns.queries))
        print(msgpack.packb([walls, cpu]).hex(), flush=True)
        return 0

    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    idx, keys = build(pods, ns.blocks, ns.prompt_blocks)
    gc.collect()
    mem = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    walls = []
    cpu0 = time.thread_time()
    for _ in range(ns.queries):
        t = time.perf_counter()
        idx.lookup_now(keys, pods)
        walls.append(time.perf_counter() - t)
    local_cpu = (time.thread_time() - cpu0) / ns.queries
    # applying stored blocks: fresh 64-block chains on one pod
    rnd = random.Random(1)
    chains = [[rnd.getrandbits(63) for _ in range(64)] for _ in range(200)]
    e = 1 << 60
    cpu0 = time.thread_time()
    for c in chains:
        idx.add(list(range(e, e + 64)), c, pods[0], 0)
        e += 64
    apply_us = (time.thread_time() - cpu0) / (64 * len(chains)) * 1e6
    rows: list[tuple[str, float, float, float]] = [
        ("in process (a copy per worker)", statistics.median(walls), pct(walls, 0.99), local_cpu)
    ]
    del idx
    gc.collect()

    with tempfile.TemporaryDirectory(prefix="pyepp-state-") as tmp:
        sock = os.path.join(tmp, "state.sock")
        base = [sys.executable, "-m", "e2e.bench.scale.state", "--pods", str(ns.pods), "--blocks", str(ns.blocks),
                "--prompt-blocks", str(ns.prompt_blocks), "--queries", str(ns.queries)]  # fmt: skip
        server = subprocess.Popen([*base, "--serve", sock], stdout=subprocess.PIPE, text=True)
        try:
            assert server.stdout is not None and server.stdout.readline().strip() == "ready"
            for clients in (1, 2):
                procs = [subprocess.Popen([*base, "--client", sock], stdout=subprocess.PIPE, text=True)
                         for _ in range(clients)]  # fmt: skip
                outs: list[Any] = [msgpack.unpackb(bytes.fromhex(pr.communicate()[0].strip())) for pr in procs]
                w = [x for o in outs for x in o[0]]
                rows.append((f"state process, {clients} querying", statistics.median(w), pct(w, 0.99),
                             statistics.median(o[1] for o in outs)))  # fmt: skip
        finally:
            server.terminate()
            server.wait()
    print(f"{ns.pods} pods, {ns.blocks:,} entries, a {ns.prompt_blocks}-block prompt, {ns.queries} queries")
    print("| lookup | wall p50 | wall p99 | querying side's CPU a pick |")
    print("|---|---:|---:|---:|")
    for name, p50, p99, cpu in rows:
        print(f"| {name} | {p50 * 1e6:.0f} µs | {p99 * 1e6:.0f} µs | {cpu * 1e6:.0f} µs |")
    print(f"index memory in one process: {mem / 2**20:.1f} MiB ({mem / ns.blocks:.0f} B an entry); a copy per worker "
          f"is N x that")  # fmt: skip
    print(f"applying a stored block: {apply_us:.2f} µs CPU (a copy per worker: N x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
