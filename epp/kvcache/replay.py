"""Replay from a publisher's ROUTER socket: fetch the batches we missed, and notice a restarted publisher.

The request is `[b"", start seq (8 bytes big-endian)]` on a DEALER; the publisher answers with every batch it
still buffers whose seq >= start, in the live frame shape (vLLM `[topic, seq, payload]`, SGLang
`[seq, payload]`), then the end marker (seq -1). When batches of the rank were already applied, the request
starts at one of them (a checkpoint) so the publisher's copy can be compared with what we applied: a
different payload, or nothing at all at or after that seq, means the publisher restarted (its numbering began
again), and the pod is cleared and replayed from 0. A failed replay puts its endpoint in a cooldown; a
semaphore bounds the replays in flight.
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

import zmq
import zmq.asyncio

from epp.framework.verbosity import DEFAULT, V
from epp.kvcache.config import PoolConfig
from epp.kvcache.events import EventBatch, parse_topic
from epp.kvcache.metrics import PoolMetrics
from epp.kvcache.sequencing import SequenceTracker, Verdict

log = logging.getLogger(__name__)

END_SEQ = (-1).to_bytes(8, "big", signed=True)


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A batch applied from one rank of a pod: its seq and the crc32 of its payload."""

    rank: int
    seq: int
    crc: int


class BatchSink(Protocol):
    """Where replayed batches go (the workers, which apply live batches the same way)."""

    def decode(self, pod: str, payload: bytes) -> EventBatch | None: ...

    async def decode_sliced(self, pod: str, payload: bytes) -> EventBatch | None: ...

    def apply(self, pod: str, model: str, batch: EventBatch) -> None: ...

    async def apply_sliced(self, pod: str, model: str, batch: EventBatch) -> None: ...

    def clear_pod(self, pod: str) -> None: ...

    async def flush(self) -> None: ...


class Replayer:
    """Replays for the workers; records what it applies in the shared SequenceTracker."""

    def __init__(self, cfg: PoolConfig, seq: SequenceTracker, sink: BatchSink, metrics: PoolMetrics) -> None:
        self.cfg = cfg
        self.seq = seq
        self.sink = sink
        self.metrics = metrics
        self._ctx = zmq.asyncio.Context.instance()
        self._sem = asyncio.Semaphore(cfg.max_concurrent_replays)
        self._failed: dict[str, float] = {}  # endpoint -> monotonic time of the last failure

    async def replay(
        self, pod: str, model: str, rank: int, endpoint: str, start: int, checkpoint: Checkpoint | None = None
    ) -> bool | None:
        """Ask the publisher's ROUTER for batches from `start`; apply those we have not applied, in order.

        When we already applied batches of this rank, the request starts one batch early so the publisher's
        copy of our last batch can be compared with what we applied. `checkpoint` names the batch to compare
        instead: a reconnect compares a batch applied before the connection.
        Returns True if the publisher restarted (the pod was cleared and replayed from 0), False if it was checked
        and did not, None if that could not be told (nothing to compare, cooldown, timeout, error).
        """
        failed = self._failed.get(endpoint)
        if failed is not None and time.monotonic() - failed < self.cfg.replay_cooldown:
            self.metrics.replays.labels("cooldown").inc()
            return None
        last = self.seq.last(pod, rank)
        expect: int | None = None
        if checkpoint is not None:
            start, expect = checkpoint.seq, checkpoint.crc
        elif last is not None and start == last + 1:
            start, expect = last, self.seq.last_crc(pod, rank) or 0
        result, got, restarted = await self._fetch(pod, model, rank, endpoint, start, expect)
        if restarted:
            log.warning("KV events: %s rank %d restarted (replay does not match); clearing its blocks", pod, rank)
            self.metrics.sequence.labels("restart").inc()
            self.sink.clear_pod(pod)
            self.seq.forget_pod(pod)
            result, got, _ = await self._fetch(pod, model, rank, endpoint, 0, None)
        self.metrics.replays.labels(result).inc()
        if result == "ok":
            self._failed.pop(endpoint, None)
        else:
            self._failed[endpoint] = time.monotonic()
        log.log(V(DEFAULT), "KV events: replay for %s from seq %d: %s, %d batches", pod, start, result, got)
        if restarted:
            return True
        return False if expect is not None and result == "ok" else None

    async def frames(self, endpoint: str, start: int) -> AsyncIterator[list[bytes]]:
        """The publisher's replay of batches from `start`, as frame lists without the DEALER delimiter.

        Ends after the END marker (which it yields); raises TimeoutError when the publisher goes quiet.
        """
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, self.cfg.max_message_bytes)
        t0 = time.monotonic()
        try:
            sock.connect(endpoint)
            await sock.send_multipart([b"", start.to_bytes(8, "big")])
            while True:
                left = self.cfg.replay_timeout - (time.monotonic() - t0)
                idle = min(self.cfg.replay_idle_timeout, left)
                if idle <= 0 or not await sock.poll(int(idle * 1000)):
                    raise TimeoutError(endpoint)
                frames = await sock.recv_multipart()
                if frames and frames[0] == b"":
                    frames = frames[1:]
                yield frames
                if len(frames) >= 2 and frames[-2] == END_SEQ:
                    return
        finally:
            sock.close(linger=0)

    async def _fetch(
        self, pod: str, model: str, rank: int, endpoint: str, start: int, expect_crc: int | None
    ) -> tuple[str, int, bool]:
        """Apply the publisher's replay from `start`. With `expect_crc`, the batch at `start` must be the one we
        applied (same crc); a different one, or none at or after `start`, reports a restart."""
        verify = expect_crc is not None
        m = self.metrics
        got, first = 0, True
        async with self._sem:
            try:
                async for frames in self.frames(endpoint, start):
                    if len(frames) == 3:  # vLLM: [topic, seq, payload]
                        seqb, payload = frames[1], frames[2]
                        model = parse_topic(frames[0])[1] or model
                    elif len(frames) == 2:  # SGLang: [seq, payload]
                        seqb, payload = frames
                    else:
                        m.zmq_errors.labels("replay_frames").inc()
                        continue
                    if seqb == END_SEQ:
                        return "ok", got, verify and first
                    if len(seqb) != 8:
                        m.zmq_errors.labels("seq").inc()
                        continue
                    m.messages.inc()
                    s = int.from_bytes(seqb, "big")
                    crc = zlib.crc32(payload)
                    if first and verify:
                        first = False
                        if s == start:
                            if crc != expect_crc:
                                return "ok", got, True
                            continue
                    first = False
                    batch = await self.sink.decode_sliced(pod, payload)
                    r = (batch.dp_rank or 0) if batch is not None else rank
                    if self.seq.check(pod, r, s, live=False) is Verdict.DUPLICATE:
                        continue
                    if batch is not None:
                        await self.sink.apply_sliced(pod, model, batch)
                    self.seq.applied(pod, r, s, crc)
                    got += 1
                    if got % 64 == 0:
                        await self.sink.flush()
                        await asyncio.sleep(0)
            except TimeoutError:
                return "timeout", got, False
            except zmq.ZMQError as e:
                log.warning("KV events: replay from %s failed: %s", endpoint, e)
                return "error", got, False
        return "ok", got, False
