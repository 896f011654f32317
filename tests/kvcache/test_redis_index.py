"""The Redis index under faults (a real redis-server killed, hung and restarted empty): lookups fall back to the
local copy within the lookup budget, changes are kept and replayed, and an empty restart is rebuilt."""

from __future__ import annotations

import asyncio
import signal
import time

from prometheus_client import REGISTRY

from e2e.harness.ports import free_port
from e2e.harness.redis import redis_process
from epp.kvcache.index import TIER_GPU
from epp.kvcache.redis_index import RedisIndex

POD, OTHER = "10.0.0.1:8000", "10.0.0.2:8000"


def _metric(name: str, labels: dict[str, str] | None = None) -> float:
    return REGISTRY.get_sample_value(name, labels or {}) or 0.0


async def _until(cond: object, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not await cond():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.05)


async def test_kill_hang_and_empty_restart() -> None:
    port = free_port()
    keys_a, keys_b = [101, 102, 103, 104], [201, 202, 203]
    with redis_process(port) as (url, proc):
        idx = RedisIndex(url, prefix="faults:")
        idx.probe_interval = 0.1
        idx.add([1, 2, 3, 4], keys_a, POD, TIER_GPU)
        await idx.flush()
        assert (await idx.lookup(keys_a))[POD].blocks == 4 and idx.up
        assert len(await idx.entries()) == 4

        # hung (SIGSTOP): a lookup answers from the local copy within its budget, and the breaker opens
        proc.send_signal(signal.SIGSTOP)
        t0 = time.monotonic()
        assert (await idx.lookup(keys_a))[POD].blocks == 4
        assert time.monotonic() - t0 < 0.3 and not idx.up
        assert _metric("kv_cache_index_redis_up") == 0
        idx.add([5, 6, 7], keys_b, OTHER, TIER_GPU)  # a change while it hangs: kept
        t0 = time.monotonic()
        await idx.flush()
        assert time.monotonic() - t0 < 0.05 and _metric("kv_cache_index_redis_pending_changes") == 3
        assert (await idx.lookup(keys_b))[OTHER].blocks == 3  # the local copy has it
        proc.send_signal(signal.SIGCONT)  # the same server: the kept changes are replayed
        await _until(lambda: _async(idx.up))
        assert {(r, p) for r, p, _ in await idx.entries()} == {(r, POD) for r in keys_a} | {(r, OTHER) for r in keys_b}

        # killed: lookups still answer; then restarted empty on the same port: rebuilt from the local copy
        proc.kill()
        proc.wait()
        rebuilds = _metric("kv_cache_index_redis_resyncs_total", {"kind": "rebuild"})
        assert (await idx.lookup(keys_a))[POD].blocks == 4 and not idx.up
        idx.evict([5], OTHER, TIER_GPU)  # a removal while down
    with redis_process(port) as (url, _):
        await _until(lambda: _async(idx.up))
        assert _metric("kv_cache_index_redis_resyncs_total", {"kind": "rebuild"}) == rebuilds + 1
        got = {(r, p) for r, p, _ in await idx.entries()}
        assert got == {(r, POD) for r in keys_a} | {(r, OTHER) for r in keys_b[1:]}
        assert (await idx.lookup(keys_a))[POD].blocks == 4
        # a second replica that ingested nothing reads the rebuilt shared map
        other = RedisIndex(url, prefix="faults:")
        assert (await other.lookup(keys_a))[POD].blocks == 4
        await other.close()
        await idx.close()


async def _async(v: bool) -> bool:
    return v
