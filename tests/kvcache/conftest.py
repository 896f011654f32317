"""Fixtures for the KV-cache tests: vLLM's real publisher, a running event pool, cuttable TCP links, free ports,
(vLLM's module and redis-server are in tests/conftest.py)."""

from __future__ import annotations

import asyncio
import contextlib
import types
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from epp.kvcache.config import PoolConfig
from tests.kvcache.vllm_rig import MODEL, Rig, TcpLink, free_port


class Publishers:
    """Start vLLM ZmqEventPublishers (PUB bound on ipc, or on tcp for a DP rank > 0; ROUTER replay on 127.0.0.1)
    and shut them down. `p.endpoint`/`p.replay` are where a subscriber finds publisher `p`."""

    def __init__(self, kv: types.ModuleType, tmp: Path) -> None:
        self.kv = kv
        self.tmp = tmp
        self.live: list[Any] = []
        self.n = 0

    def start(self, topic: str = "", endpoint: str | None = None, replay: str | None = None, rank: int = 0) -> Any:
        """Like vLLM, a rank r > 0 offsets the tcp ports by r (vLLM refuses ipc there), so the defaults are
        picked r below a free port; its batches carry `data_parallel_rank = r` and their own seq numbering."""
        self.n += 1
        if endpoint is None:
            endpoint = f"ipc://{self.tmp}/pub{self.n}" if rank == 0 else f"tcp://*:{free_port() - rank}"
        replay = replay or f"tcp://127.0.0.1:{free_port() - rank}"
        p = self.kv.ZmqEventPublisher(rank, endpoint=endpoint, replay_endpoint=replay, topic=topic)
        p.endpoint, p.replay = p._endpoint.replace("*", "127.0.0.1"), p._replay_endpoint
        p.base = (topic, endpoint, replay, rank)
        self.live.append(p)
        return p

    async def restart(self, p: Any) -> Any:
        """A new engine process on `p`'s endpoints: its seq starts again at 0 and its buffer is empty."""
        self.stop(p)
        for _ in range(200):  # libzmq closes the old ROUTER asynchronously; the port frees up shortly
            try:
                return self.start(*p.base)
            except zmq.ZMQError:
                await asyncio.sleep(0.05)
        raise AssertionError(f"could not rebind {p.endpoint}")

    def stop(self, p: Any) -> None:
        p.shutdown()
        self.live.remove(p)

    def close(self) -> None:
        for p in list(self.live):
            self.stop(p)


@pytest.fixture
def publishers(vllm_kv: types.ModuleType, tmp_path: Path) -> Iterator[Publishers]:
    pubs = Publishers(vllm_kv, tmp_path)
    yield pubs
    pubs.close()


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    """A running EventPool over a memory index (replay idle timeout 1 s)."""
    r = Rig(PoolConfig(concurrency=2, topic_filter="kv@", default_model=MODEL, replay_idle_timeout=1.0))
    task = asyncio.create_task(r.pool.run())
    await r.pool.started()
    yield r
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


@pytest.fixture
async def links() -> AsyncIterator[list[TcpLink]]:
    """Started TcpLinks appended here are cut at the end."""
    out: list[TcpLink] = []
    yield out
    for link in out:
        await link.cut()
