"""Shared by the KV-event tests against vLLM's real publisher: an EventPool over a memory index, event builders,
and a TCP link that can be cut (a network drop between our SUB and the publisher's PUB)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry

from epp.framework import DataMap, Endpoint
from epp.kvcache.config import PoolConfig
from epp.kvcache.index import MemoryIndex
from epp.kvcache.ingest import EventApplier
from epp.kvcache.metrics import PoolMetrics
from epp.kvcache.pool import EventPool
from epp.kvcache.subscriptions import EVENTS_ENDPOINT_ATTR, REPLAY_ENDPOINT_ATTR
from epp.kvcache.tokens import TokenProcessor

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
BS = 16
TOKENS = list(range(1000, 1000 + 8 * BS))  # 8 blocks


def stored(kv: Any, hashes: list[int], parent: int | None, tokens: list[int], medium: str = "GPU") -> Any:
    return kv.BlockStored(
        block_hashes=hashes,
        parent_block_hash=parent,
        token_ids=tokens,
        block_size=BS,
        lora_id=None,
        medium=medium,
        lora_name=None,
    )


def batch(kv: Any, *events: Any) -> Any:
    return kv.KVEventBatch(ts=time.time(), events=list(events))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def until(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.01)


class Rig:
    def __init__(self, cfg: PoolConfig) -> None:
        self.tp = TokenProcessor(BS, hash_seed="42")
        self.index = MemoryIndex()
        self.applier = EventApplier(self.index, self.tp)
        self.registry = CollectorRegistry()
        self.pool = EventPool(self.applier, cfg, PoolMetrics(self.registry))

    def keys(self, tokens: list[int]) -> list[int]:
        return self.tp.block_keys(tokens, MODEL)

    def blocks(self, tokens: list[int], pod: str) -> int:
        m = self.index.lookup_now(self.keys(tokens)).get(pod)
        return m.blocks if m else 0

    def metric(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0


def endpoint(name: str, port: int, pub: Any, events: str | None = None) -> Endpoint:
    """An endpoint at 127.0.0.1:`port` whose events come from `pub` (or from `events`, e.g. a TcpLink)."""
    return Endpoint(
        name=name,
        address="127.0.0.1",
        port=port,
        attributes=DataMap({EVENTS_ENDPOINT_ATTR: events or pub.endpoint, REPLAY_ENDPOINT_ATTR: pub.replay}),
    )


class TcpLink:
    """A TCP forwarder to `target` ("host:port") that can be cut and restored.

    Cut closes every forwarded connection and stops listening, so the subscriber's reconnects are refused (no
    connect event) until `restore` listens on the same port again; meanwhile the publisher has no subscriber.
    """

    def __init__(self, target: str) -> None:
        host, _, port = target.rpartition(":")
        self.target = (host, int(port))
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    async def start(self) -> TcpLink:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def cut(self) -> None:
        for w in list(self._writers):
            w.close()
        self._writers.clear()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def restore(self) -> None:
        await self.start()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}
        await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer))

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, ConnectionError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()
        self._writers.discard(writer)
