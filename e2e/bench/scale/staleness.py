"""How stale one replica's view of another's picks is: the time from a pick's booking on replica A (the message its
plugin queues at PreRequest) to replica B's plugin holding it, through a real redis-server and two
redis-cross-replica-syncers, each in its own process (its own event loop, as two replicas are).

Releases are not messaged: B sees A's finished requests leave at A's next snapshot round, so that side is bounded by
`crossReplicaSyncInterval` plus one round trip by construction; this measures the booking side, at a steady rate and
in bursts (every message of a burst queued at once, as a burst of picks would).

    python -m e2e.bench.scale.staleness            # ~20 s
    python -m e2e.bench.scale.staleness --via relay   # the same between two `--workers` (the parent's relay)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing as mp
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

from e2e.harness.redis import redis_server
from epp.datalayer.plugins.redis_cross_replica_syncer import RedisCrossReplicaSyncer
from epp.datalayer.plugins.worker_state_syncer import WorkerStateSyncer
from epp.server.workers import start_relay


class Probe:
    """A CrossReplicaMessenger whose messages carry their send time (CLOCK_MONOTONIC is per host, not per process)."""

    name = "probe"

    def __init__(self) -> None:
        self.send: Callable[[Any], None] = lambda _m: None
        self.delays: list[float] = []

    def cross_replica_channel(self) -> str:
        return "probe"

    def cross_replica_connect(self, send: Callable[[Any], None]) -> None:
        self.send = send

    def cross_replica_receive(self, message: Any) -> None:
        self.delays.append(time.monotonic() - float(message))

    def cross_replica_reset(self) -> None:
        pass


def _syncer(url: str, replica: str, probe: Probe) -> RedisCrossReplicaSyncer:
    """`url`: a Redis URL, or `relay:<socket>` for the workers' relay."""
    if url.startswith("relay:"):
        s: RedisCrossReplicaSyncer = WorkerStateSyncer("xr", socket_path=url[6:], replica_id=replica)
    else:
        s = RedisCrossReplicaSyncer("xr", address=url, replica_id=replica, key_prefix="epp:staleness")
    s.attach_messengers([probe])
    return s


def receiver(url: str, expected: int, out: Any, ready: Any) -> None:
    async def main() -> None:
        probe = Probe()
        task = asyncio.create_task(_syncer(url, "b", probe).run())
        await asyncio.sleep(0.5)  # subscribed
        ready.set()
        deadline = time.monotonic() + 60
        while len(probe.delays) < expected and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        task.cancel()
        out.put(probe.delays)

    asyncio.run(main())


async def sender(url: str, steady: int, rate: float, bursts: int, burst: int) -> None:
    probe = Probe()
    task = asyncio.create_task(_syncer(url, "a", probe).run())
    await asyncio.sleep(0.3)
    for _ in range(steady):
        probe.send(time.monotonic())
        await asyncio.sleep(1 / rate)
    for _ in range(bursts):
        for _ in range(burst):
            probe.send(time.monotonic())
        await asyncio.sleep(0.1)
    await asyncio.sleep(0.5)
    task.cancel()


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steady", type=int, default=2000, help="messages at --rate")
    ap.add_argument("--rate", type=float, default=500.0, help="steady messages per second")
    ap.add_argument("--bursts", type=int, default=20)
    ap.add_argument("--burst", type=int, default=64, help="messages queued at once per burst")
    ap.add_argument("--via", choices=("redis", "relay"), default="redis")
    ns = ap.parse_args(argv)
    with contextlib.ExitStack() as stack:
        if ns.via == "relay":
            sock = os.path.join(stack.enter_context(tempfile.TemporaryDirectory()), "relay.sock")
            start_relay(sock)
            url = f"relay:{sock}"
        else:
            url = stack.enter_context(redis_server())
        ctx = mp.get_context("spawn")
        out, ready = ctx.Queue(), ctx.Event()
        total = ns.steady + ns.bursts * ns.burst
        proc = ctx.Process(target=receiver, args=(url, total, out, ready))
        proc.start()
        ready.wait(30)
        asyncio.run(sender(url, ns.steady, ns.rate, ns.bursts, ns.burst))
        delays: list[float] = out.get(timeout=90)
        proc.join(10)
    steady, bursty = delays[: ns.steady], delays[ns.steady :]
    print(f"delivered {len(delays)}/{total}")
    for label, xs in (("steady", steady), ("bursts", bursty)):
        if xs:
            ms = [1000 * x for x in xs]
            print(
                f"{label:7s} n={len(ms):5d} p50 {statistics.median(ms):.3f} ms  p90 {pct(ms, 0.9):.3f}  "
                f"p99 {pct(ms, 0.99):.3f}  max {max(ms):.3f}"
            )


if __name__ == "__main__":
    main()
