"""worker-state-syncer through the parent's real relay (epp.server.workers.relay) on a Unix socket: two workers'
pipelines book each other's picks at once and each other's snapshots every interval, a dead worker stops counting
after the TTL, and a relay that goes away and comes back is said and reconnected."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from epp.config.loader import ConfigError, parse_config
from epp.datalayer.datastore import Datastore
from epp.datalayer.plugins.redis_cross_replica_syncer import CONNECTED
from epp.datalayer.plugins.worker_state_syncer import WorkerStateSyncer
from epp.framework import ApiKind, Endpoint, InferenceRequest, ProfileResult, SchedulingResult
from epp.plugins.producers.inflight_load_producer import InFlightLoadProducer
from epp.requestcontrol.pipeline import Pipeline
from epp.server.workers import relay
from epp.wiring import build_pipeline, plugin_context

CHAIN = "plugins:\n- {type: inflight-load-producer}\n- {type: token-load-scorer}\n"


def worker(sock: str, interval: str = "") -> tuple[Pipeline, Datastore, list]:
    ds = Datastore()
    for i in range(3):
        ds.upsert(Endpoint(f"pod{i}", f"10.0.0.{i + 1}", 8000))
    cfg = parse_config(CHAIN + (f"dataLayer: {{crossReplicaSyncInterval: {interval}}}\n" if interval else ""))
    assert cfg.share_with_workers(sock) == "cross-replica-syncer"
    ctx = plugin_context(ds)
    return build_pipeline(cfg, ctx), ds, ctx.background


def book(pipeline: Pipeline, ds: Datastore, pod: str, tokens: int, rid: str) -> InferenceRequest:
    producer = pipeline.plugins["inflight-load-producer"]
    assert isinstance(producer, InFlightLoadProducer)
    r = InferenceRequest(rid, "/v1/completions", ApiKind.COMPLETIONS, "m", "m", {}, prompt="x" * (4 * tokens))
    ep = ds.get(pod)
    assert ep is not None
    producer.pre_request(r, SchedulingResult({"default": ProfileResult([ep])}, "default"))
    return r


async def wait_for(cond, timeout: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def relaying(sock: str) -> AsyncIterator[None]:
    task = asyncio.create_task(relay(sock))
    await wait_for(lambda: Path(sock).exists())
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_pick_in_one_worker_is_booked_in_the_other_before_the_next_round(tmp_path: Path) -> None:
    sock = str(tmp_path / "s.sock")
    async with relaying(sock):
        p1, ds1, bg1 = worker(sock, interval="10s")  # the snapshots are 10 s apart: only the message can tell
        p2, _, bg2 = worker(sock, interval="10s")
        tasks = [asyncio.create_task(t()) for t in (*bg1, *bg2)]
        try:
            s1, s2 = p1.plugins["cross-replica-syncer"], p2.plugins["cross-replica-syncer"]
            assert isinstance(s1, WorkerStateSyncer) and isinstance(s2, WorkerStateSyncer)
            await wait_for(lambda: s1.peers != [] and s2.peers != [])  # both connected (their first snapshot)
            load2 = p2.plugins["inflight-load-producer"].loads  # type: ignore[attr-defined]
            book(p1, ds1, "pod1", 800, "a")
            await wait_for(lambda: load2["pod1"].remote_tokens == 800, timeout=5.0)
            assert (load2["pod1"].remote_requests, load2["pod0"].remote_tokens) == (1, 0)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def test_snapshots_are_summed_a_dead_worker_expires_and_the_relay_coming_back_is_reconnected(
    tmp_path: Path,
) -> None:
    sock = str(tmp_path / "s.sock")
    p1, ds1, bg1 = worker(sock)
    p2, ds2, bg2 = worker(sock)
    s1 = p1.plugins["cross-replica-syncer"]
    assert isinstance(s1, WorkerStateSyncer) and s1.interval == 0.05 and s1.ttl == 1.0
    load1 = p1.plugins["inflight-load-producer"].loads  # type: ignore[attr-defined]
    async with relaying(sock):
        t1 = [asyncio.create_task(t()) for t in bg1]
        t2 = [asyncio.create_task(t()) for t in bg2]
        try:
            r = book(p2, ds2, "pod0", 500, "b")
            book(p2, ds2, "pod2", 100, "c")
            book(p1, ds1, "pod0", 1000, "a")
            await wait_for(lambda: load1["pod0"].total_tokens == 1500 and load1["pod2"].total_tokens == 100)
            p2.plugins["inflight-load-producer"].response_complete(r, None, None)  # type: ignore[attr-defined]
            await wait_for(lambda: load1["pod0"].total_tokens == 1000)  # the release, at the next snapshot
            for t in t2:  # worker 2 dies: after the 1 s TTL worker 1 counts its own load only
                t.cancel()
            await asyncio.gather(*t2, return_exceptions=True)
            died = asyncio.get_running_loop().time()
            await wait_for(lambda: load1["pod2"].total_tokens == 0 and s1.peers == [])
            assert asyncio.get_running_loop().time() - died >= 0.9
        finally:
            for t in t2:
                t.cancel()
    # the relay is gone: worker 1 says so and keeps its own view
    await wait_for(lambda: s1.link.up is False)
    assert CONNECTED._value.get() == 0
    assert load1["pod0"].total_tokens == 1000
    Path(sock).unlink(missing_ok=True)
    async with relaying(sock):  # back: worker 1 reconnects, a new worker 2 shares again
        t2 = [asyncio.create_task(t()) for t in worker(sock)[2]]
        try:
            await wait_for(lambda: s1.link.up is True and len(s1.peers) == 1)
            assert CONNECTED._value.get() == 1
        finally:
            for t in (*t1, *t2):
                t.cancel()
            await asyncio.gather(*t1, *t2, return_exceptions=True)


def test_the_socket_is_required() -> None:
    cfg = parse_config(CHAIN + "- {type: worker-state-syncer}\n")
    with pytest.raises(ConfigError, match="socket"):
        build_pipeline(cfg, plugin_context(Datastore()))
