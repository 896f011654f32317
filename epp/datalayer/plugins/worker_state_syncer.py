"""worker-state-syncer: what the workers of one `epp serve --workers N` share with each other, through the parent
process's relay on a Unix socket (no Redis): the same contributors and messengers as a cross-replica syncer (the
in-flight load, each pick's speculative prefix entries, prefill-cost bookings), so a pick in worker A is booked in
worker B as soon as the relay hands the message over, not at B's next scrape or KV event.

`epp serve --workers N` adds it by itself when the config names no cross-replica syncer (with one, e.g.
`--cross-replica-address`, every worker shares through that as a replica of its own). Frames are a 4-byte length
and the JSON the Redis syncer publishes: `{from, m: [[channel, message], ...]}` for messages, `{from, s: {state key:
snapshot}}` for each worker's snapshot, sent every `crossReplicaSyncInterval` (50 ms unless the config sets one). A
worker silent for `ttl` stops counting (a worker that died: its streams died with it). The relay down (the parent
restarting it, or gone): the worker routes on its own state, says so (`epp_cross_replica_connected` 0, a warning)
and reconnects.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
import time
from typing import Any, Self

from epp.datalayer.plugins.redis_cross_replica_syncer import (
    MAX_PAYLOAD,
    PEERS,
    SYNCS,
    RedisCrossReplicaSyncer,
    _Failures,
    _Link,
    sum_parsed,
)
from epp.framework import Params, PluginContext

_LEN = struct.Struct(">I")
WORKER_INTERVAL = 0.05


def frame(data: bytes) -> bytes:
    return _LEN.pack(len(data)) + data


async def read_frame(reader: asyncio.StreamReader) -> bytes:
    """One frame's payload; a frame over MAX_PAYLOAD is refused (ValueError: the connection is closed)."""
    (n,) = _LEN.unpack(await reader.readexactly(_LEN.size))
    if n > MAX_PAYLOAD:
        raise ValueError(f"frame of {n} bytes")
    return await reader.readexactly(n)


class WorkerStateSyncer(RedisCrossReplicaSyncer):
    type_name = "worker-state-syncer"

    def __init__(
        self, name: str | None = None, *, socket_path: str, replica_id: str | None = None, ttl: float = 1.0
    ) -> None:
        super().__init__(name, address=f"unix://{socket_path}", replica_id=replica_id, key_prefix="workers", ttl=ttl)
        self.socket_path = socket_path
        self.interval = WORKER_INTERVAL
        self.link = _Link(f"{self.name}: the workers' relay at {socket_path}", self._link_down)
        self._remote: dict[str, tuple[float, dict[str, Any]]] = {}  # sender -> (when, {state key: snapshot})

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        syncer = cls(
            name,
            socket_path=params.str("socket", ""),
            replica_id=params.str("replicaId", "") or None,
            ttl=params.duration("ttl", 1.0),
        )
        if not syncer.socket_path:
            raise params.fail("socket", "required: the relay's Unix socket (`epp serve --workers` sets it)")
        if syncer.ttl <= 0:
            raise params.fail("ttl", "must be positive")
        context.run_in_background(syncer.run)
        return syncer

    async def run(self) -> None:
        if not self.contributors and not self.messengers:
            return
        failures = _Failures(f"{self.name}: the workers' relay at {self.socket_path}", self.link)
        while True:
            try:
                reader, writer = await asyncio.open_unix_connection(self.socket_path)
            except OSError as e:
                self._expire()
                await failures.failed(e, self._backoff)
                continue
            failures.ok()
            # not a TaskGroup: its cancelling the parent when a child fails would read as this task being stopped
            halves = [asyncio.create_task(self._read(reader)), asyncio.create_task(self._write(writer))]
            try:
                done, _ = await asyncio.wait(halves, return_when=asyncio.FIRST_EXCEPTION)
            finally:
                for t in halves:
                    t.cancel()
                await asyncio.gather(*halves, return_exceptions=True)
                writer.close()
            error = next((t.exception() for t in done if not t.cancelled() and t.exception() is not None), None)
            if not isinstance(error, OSError | asyncio.IncompleteReadError | ValueError):
                raise error or RuntimeError("the relay's connection ended")
            self._expire()
            await failures.failed(error, self._backoff)

    async def _write(self, writer: asyncio.StreamWriter) -> None:
        """Messages as they are queued (batched), and this worker's snapshot every interval."""
        wake = self._wake = asyncio.Event()
        keyed = [(c, c.cross_replica_key()) for c in self.contributors]
        keyed = [(c, k) for c, k in keyed if k]
        next_round = 0.0
        while True:
            now = time.monotonic()
            if keyed and now >= next_round:
                snap = {k: c.cross_replica_snapshot() for c, k in keyed}
                payload = {"from": self.sender, "s": snap}
                writer.write(frame(json.dumps(payload, separators=(",", ":")).encode()))
                next_round = now + self.interval
                self._expire()
                SYNCS.labels("ok").inc()
            while self._outbox:
                batch = self._next_batch()
                if batch:
                    writer.write(frame(f'{{"from":{json.dumps(self.sender)},"m":[{",".join(batch)}]}}'.encode()))
            await writer.drain()
            wake.clear()
            if self._outbox:
                continue
            timeout = max(0.0, next_round - time.monotonic()) if keyed else None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), timeout)

    async def _read(self, reader: asyncio.StreamReader) -> None:
        while True:
            data = await read_frame(reader)
            try:
                payload = json.loads(data)
            except ValueError:
                continue
            if isinstance(payload, dict) and isinstance(payload.get("s"), dict):
                sender = payload.get("from")
                if isinstance(sender, str) and sender != self.sender:
                    self._remote[sender] = (time.monotonic(), payload["s"])
                    self._apply()
            else:
                self.deliver(data)

    def _expire(self) -> None:
        """Workers silent for `ttl` stop counting."""
        horizon = time.monotonic() - self.ttl
        gone = [s for s, (when, _) in self._remote.items() if when < horizon]
        for s in gone:
            del self._remote[s]
        if gone:
            self._apply()

    def _apply(self) -> None:
        self.peers = sorted(self._remote)
        PEERS.set(len(self.peers))
        for c in self.contributors:
            key = c.cross_replica_key()
            if key:
                c.cross_replica_update(sum_parsed(snap.get(key) for _, snap in self._remote.values()))
        self.rounds += 1
