"""ZMQ publisher with vLLM's `ZmqEventPublisher` behaviour, driven by the asyncio loop (never blocks).

PUB frames are `[topic, seq 8-byte big-endian, msgpack EventBatch]`; the PUB binds when the endpoint has
`*` (or `::`, ipc/inproc) and connects otherwise; data-parallel rank r offsets tcp ports by r. The
optional ROUTER replay socket answers `[start_seq]` with every buffered batch whose seq >= start_seq
in the live frame shape, then the end marker `[b"", (-1) 8 bytes, b""]`. Events queued during one
loop iteration go out as one batch (vLLM sends one batch per engine step).

Failure modes for tests: `mode = "off"` drops events unsent and unbuffered, `"lossy"` numbers and
buffers batches but skips the PUB send (a gap that replay can fill), and `restart()` recreates the
sockets with the sequence back at 0 and an empty buffer (a restarted vLLM).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque

import zmq
import zmq.asyncio

from e2e.sim.events import KVEvent, encode_batch

log = logging.getLogger("e2e.sim.publisher")

END_SEQ = (-1).to_bytes(8, "big", signed=True)


def offset_endpoint_port(endpoint: str | None, rank: int) -> str | None:
    """vLLM's rule: `tcp://host:PORT` → PORT+rank (port 0 untouched), `inproc://x` → `inproc://x_dp<rank>`."""
    if not endpoint or rank == 0:
        return endpoint
    if "inproc" in endpoint:
        return f"{endpoint}_dp{rank}"
    base, _, port = endpoint.rpartition(":")
    if not port.isdigit() or int(port) == 0:
        return endpoint
    return f"{base}:{int(port) + rank}"


def _is_bind(endpoint: str) -> bool:
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


def _bind(sock: zmq.Socket[bytes] | zmq.asyncio.Socket, endpoint: str) -> str:
    """Bind; port 0 (or `*`) picks a free port. Returns the endpoint actually bound (wildcard host kept)."""
    base, _, port = endpoint.rpartition(":")
    if endpoint.startswith("tcp://") and port in ("0", "*"):
        sock.bind(f"{base}:*")
        bound = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        return f"{base}:{bound.rpartition(':')[2]}"
    sock.bind(endpoint)
    return endpoint


class EventPublisher:
    def __init__(
        self,
        *,
        endpoint: str,
        replay_endpoint: str | None,
        topic: str,
        data_parallel_rank: int = 0,
        encoding: str = "array",
        buffer_steps: int = 10_000,
        hwm: int = 100_000,
        force_bind: bool = False,
        count_subscribers: bool = False,
    ) -> None:
        self.force_bind = force_bind
        self.count_subscribers = count_subscribers
        self.endpoint = offset_endpoint_port(endpoint, data_parallel_rank) or endpoint
        self.replay_endpoint = offset_endpoint_port(replay_endpoint, data_parallel_rank)
        self.topic = topic.encode()
        self.rank = data_parallel_rank
        self.encoding = encoding
        self.hwm = hwm
        self.buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self.mode = "on"
        self.seq = 0
        self.batches_sent = 0
        self._pending: list[KVEvent] = []
        self._flush_scheduled = False
        self._ctx = zmq.asyncio.Context.instance()
        self._pub: zmq.Socket[bytes] | None = None
        self._replay: zmq.asyncio.Socket | None = None
        self._replay_task: asyncio.Task[None] | None = None
        # Subscribers' connections to the PUB (a bound PUB's socket monitor, with count_subscribers): accepted so far,
        # and open now. Off by default: the monitor is a test's instrument, not part of what a pod does.
        self.connections = 0
        self.subscribers = 0
        self._monitor_task: asyncio.Task[None] | None = None

    # --- lifecycle ------------------------------------------------------------------------------------
    def start(self) -> None:
        pub: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.PUB)  # PUB never blocks: plain socket
        pub.setsockopt(zmq.SNDHWM, self.hwm)
        pub.setsockopt(zmq.LINGER, 0)
        if self.force_bind or _is_bind(self.endpoint):
            if self.count_subscribers:
                mon = pub.get_monitor_socket(zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)
                self._monitor_task = asyncio.get_running_loop().create_task(self._count_connections(mon))
            self.endpoint = _bind(pub, self.endpoint)
        else:
            pub.connect(self.endpoint)
        self._pub = pub
        if self.replay_endpoint:
            rep = self._ctx.socket(zmq.ROUTER)
            rep.setsockopt(zmq.SNDHWM, 2 * (self.buffer.maxlen or 1) + 2)
            rep.setsockopt(zmq.LINGER, 0)
            self.replay_endpoint = _bind(rep, self.replay_endpoint)
            self._replay = rep
            self._replay_task = asyncio.get_running_loop().create_task(self._serve_replay(rep))
        log.info("kv events: PUB %s replay %s topic %s", self.endpoint, self.replay_endpoint, self.topic.decode())

    async def _count_connections(self, mon: zmq.Socket[bytes]) -> None:
        from zmq.utils.monitor import parse_monitor_message

        amon = zmq.asyncio.Socket.shadow(mon.underlying)
        try:
            while True:
                event = parse_monitor_message(await amon.recv_multipart())["event"]
                if event == zmq.EVENT_ACCEPTED:
                    self.connections += 1
                    self.subscribers += 1
                elif event == zmq.EVENT_DISCONNECTED:
                    self.subscribers = max(0, self.subscribers - 1)
        except (asyncio.CancelledError, zmq.ZMQError):
            pass
        finally:
            mon.close(linger=0)

    async def close(self) -> None:
        if self._replay_task is not None:
            self._replay_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._replay_task
            self._replay_task = None
        if self._monitor_task is not None:
            self._monitor_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._monitor_task
            self._monitor_task = None
            self.subscribers = 0
        for sock in (self._pub, self._replay):
            if sock is not None:
                sock.close(linger=0)
        self._pub = self._replay = None

    async def restart(self) -> None:
        """A restarted engine: new sockets, sequence from 0, nothing to replay."""
        await self.close()
        self.seq = 0
        self.buffer.clear()
        self._pending.clear()
        await asyncio.sleep(0.05)  # let the OS release the ports before rebinding
        self.start()

    # --- publishing -----------------------------------------------------------------------------------
    def publish(self, events: list[KVEvent]) -> None:
        if self.mode == "off" or not events:
            return
        self._pending.extend(events)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if not self._pending:
            return
        events, self._pending = self._pending, []
        payload = encode_batch(time.time(), events, self.rank, self.encoding)
        seq = self.seq
        self.seq += 1
        self.buffer.append((seq, payload))
        if self.mode == "lossy" or self._pub is None:
            return
        try:
            self._pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload], flags=zmq.NOBLOCK)
            self.batches_sent += 1
        except zmq.Again:
            log.warning("kv events: PUB high-water mark reached, batch %d dropped", seq)

    async def _serve_replay(self, sock: zmq.asyncio.Socket) -> None:
        while True:
            try:
                frames = await sock.recv_multipart()
            except (zmq.ZMQError, asyncio.CancelledError):
                return
            if len(frames) != 3:
                log.warning("kv events: invalid replay request with %d frames", len(frames))
                continue
            client, _, start = frames
            start_seq = int.from_bytes(start, "big")
            # a ROUTER drops (never blocks) when a client's queue is full, so these awaits return at once
            for seq, payload in list(self.buffer):
                if seq >= start_seq:
                    await sock.send_multipart([client, b"", self.topic, seq.to_bytes(8, "big"), payload])
            await sock.send_multipart([client, b"", b"", END_SEQ, b""])
