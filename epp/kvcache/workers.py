"""Sharded workers: apply each pod's KV-event batches to the index in order, repairing gaps by replay.

A message must be exactly `[topic, seq (8 bytes big-endian), payload]`; `submit` validates it and queues it on
its pod's shard (the pod hashes to one worker, which keeps per-pod order). Queues are bounded and a full queue
drops the message (counted, logged, and later repaired by the gap replay it causes). Each batch's seq is
checked first (`SequenceTracker`): next → apply, duplicate → drop, gap or mid-stream join → replay the
missing batches first, restart → clear the pod. Workers yield to the event loop after every batch, so the
request path never waits behind a burst of events.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from epp.framework.logthrottle import LogThrottle
from epp.framework.verbosity import DEFAULT, V
from epp.kvcache.config import PoolConfig
from epp.kvcache.events import (
    STEP_BYTES,
    DecodeError,
    EventBatch,
    batch_from_raw,
    decode_batch,
    mask_steps,
    parse_topic,
    unpack_steps,
)
from epp.kvcache.ingest import RELEASE_STEP, ApplyStats, EventApplier, long_lists, slice_batch
from epp.kvcache.metrics import PoolMetrics
from epp.kvcache.replay import Checkpoint, Replayer
from epp.kvcache.sequencing import SequenceTracker, Verdict
from epp.kvcache.validation import MAX_MODELS_PER_POD, MAX_RANKS_PER_POD

log = logging.getLogger(__name__)
_throttle = LogThrottle()  # one line per kind of bad message every 5 s; the counters stay exact


# Payload bytes checksummed between two yields (a 9 MiB batch took ~2 ms in one piece on a slow core).
CRC_STEP = 1 << 20


async def crc32_sliced(payload: bytes) -> int:
    """`zlib.crc32(payload)`, yielding to the event loop every CRC_STEP bytes of a large payload."""
    if len(payload) <= CRC_STEP:
        return zlib.crc32(payload)
    mv = memoryview(payload)
    crc = 0
    for i in range(0, len(mv), CRC_STEP):
        crc = zlib.crc32(mv[i : i + CRC_STEP], crc)
        await asyncio.sleep(0)
    return crc


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic GC off while one large batch is decoded, applied and let go. Its lists (two million token ids in
    one) are new objects, and the one collection that walks them meanwhile does so whole: milliseconds of CPU in one
    piece, however finely the work itself is sliced. Refcounting
    frees everything as usual; collections resume when the batch is done (seconds at most: the payload is bounded
    by maxMessageBytes). Not nested: a batch that starts while GC is off (another batch's pause, or the process's
    own choice) leaves it as it is, so GC is never held off longer than one batch."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@dataclass(frozen=True, slots=True)
class Resync:
    """Queued when a subscription (re)connects: replay what the publisher sent while we were not subscribed."""

    pod: str
    endpoint: str
    checkpoints: tuple[Checkpoint, ...]  # batches applied before the connection, to check the publisher against


_Frame = tuple[str, str, int, bytes, str | None]  # pod, model, seq, payload, replay endpoint
_Item = _Frame | Resync


class ShardedWorkers:
    """The shard queues and their workers; also the `BatchSink` its replayer applies through."""

    def __init__(
        self,
        applier: EventApplier,
        cfg: PoolConfig,
        metrics: PoolMetrics,
        on_applied: Callable[[str, ApplyStats], None] | None = None,
    ) -> None:
        self.applier = applier
        self.index = applier.index
        self.cfg = cfg
        self.metrics = metrics
        self.on_applied = on_applied
        self.seq = SequenceTracker()
        self.stats = ApplyStats()
        self.replayer = Replayer(cfg, self.seq, self, metrics)
        self._queues = [asyncio.Queue[_Item](cfg.queue_size) for _ in range(cfg.concurrency)]
        self._shard_of: dict[str, int] = {}
        self._replay_eps: dict[str, str | None] = {}  # pod -> replay endpoint, for messages that name none
        # pod -> the models its topics named, least recently named first (bounded per pod)
        self._models: dict[str, OrderedDict[str, None]] = {}
        # Central bind: the pods in the Datastore (set by the subscriptions); messages naming others are dropped.
        self.known_pods: set[str] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._last_drop_log = 0.0
        self.queued_bytes = 0  # payload bytes waiting in the queues (bounded by cfg.max_queued_bytes)
        metrics.capacity.set(cfg.queue_size * cfg.concurrency)
        metrics.queue_depth.set_function(lambda: sum(q.qsize() for q in self._queues))

    # ------------------------------------------------------------ pods (from the subscriptions)
    def set_replay_endpoint(self, pod: str, endpoint: str | None) -> None:
        """Where `pod` answers replays, for messages whose receiver does not know it (central bind)."""
        self._replay_eps[pod] = endpoint

    def forget(self, pod: str) -> None:
        """The pod left: drop its blocks, its sequence state and its replay endpoint."""
        self._replay_eps.pop(pod, None)
        self._models.pop(pod, None)
        self._shard_of.pop(pod, None)
        self.applier.forget(pod)
        self.seq.forget_pod(pod)

    def checkpoints(self, pod: str) -> tuple[Checkpoint, ...]:
        """The last batch applied from each rank of `pod`, for a resync to compare with the publisher's copy."""
        out = []
        for rank in self.seq.ranks(pod):
            last, crc = self.seq.last(pod, rank), self.seq.last_crc(pod, rank)
            if last is not None:
                out.append(Checkpoint(rank, last, crc or 0))
        return tuple(out)

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._worker(q)) for q in self._queues]

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(BaseException):
                await t
        self._tasks = []

    async def drain(self, timeout: float = 5.0) -> None:
        """Wait until the shard queues are empty and the workers idle (tests, benchmarks)."""
        deadline = time.monotonic() + timeout
        while any(q.qsize() or q._unfinished_tasks for q in self._queues):  # type: ignore[attr-defined]
            if time.monotonic() > deadline:
                raise TimeoutError("event pool did not drain")
            await asyncio.sleep(0.005)

    # ------------------------------------------------------------ receiving
    def _shard(self, pod: str) -> asyncio.Queue[_Item]:
        s = self._shard_of.get(pod)
        if s is None:
            s = zlib.crc32(pod.encode()) % len(self._queues)
            self._shard_of[pod] = s
        return self._queues[s]

    def submit(self, frames: list[bytes], source_pod: str | None, replay: str | None = None) -> bool:
        """Validate one ZMQ message and queue it for its pod's worker; False if it was dropped."""
        m = self.metrics
        m.messages.inc()
        if len(frames) != 3:
            m.zmq_errors.labels("frames").inc()
            _throttle.log(
                log, logging.WARNING, "frames", "dropping KV-event message with %d frames (want 3) from %s",
                len(frames), source_pod or "?",
            )  # fmt: skip
            return False
        topic, seqb, payload = frames
        if len(seqb) != 8:
            m.zmq_errors.labels("seq").inc()
            _throttle.log(
                log, logging.WARNING, "seq", "dropping KV-event message with a %d-byte sequence frame from %s",
                len(seqb), source_pod or "?",
            )  # fmt: skip
            return False
        tpod, model = parse_topic(topic)
        pod = source_pod or tpod
        if not pod:
            m.dropped.labels("no_pod").inc()
            _throttle.log(
                log, logging.WARNING, "no_pod", "dropping KV-event message: topic %r names no pod", topic[:80]
            )
            return False
        if source_pod is None and self.known_pods is not None and pod not in self.known_pods:
            # Central bind: anyone who reaches the socket can name any pod; only the pool's pods get state here.
            m.dropped.labels("unknown_pod").inc()
            _throttle.log(
                log, logging.WARNING, "unknown_pod", "dropping KV-event message for %r: not an endpoint of the pool",
                pod[:80],
            )  # fmt: skip
            return False
        models = self._models.setdefault(pod, OrderedDict())
        if model in models:
            models.move_to_end(model)
        else:
            if len(models) >= MAX_MODELS_PER_POD:
                # Forget the least recently named model rather than refuse the new one: topics forged in central
                # mode must not fill a real pod's room before (or while) its own model's events come.
                old, _ = models.popitem(last=False)
                m.evicted.labels("model").inc()
                _throttle.log(
                    log, logging.WARNING, "too_many_models", "KV events: the topics naming %s named %d models; "
                    "forgetting the least recent, %r, for %r", pod[:80], MAX_MODELS_PER_POD, old[:80], model[:80],
                )  # fmt: skip
            models[model] = None
        if replay is None and source_pod is None:
            replay = self._replay_eps.get(pod)
        return self._put(pod, (pod, model or self.cfg.default_model, int.from_bytes(seqb, "big"), payload, replay))

    def resync(self, pod: str, endpoint: str, checkpoints: tuple[Checkpoint, ...]) -> bool:
        """Queue a replay of what `endpoint` buffered past `checkpoints` behind the pod's queued batches."""
        return self._put(pod, Resync(pod, endpoint, checkpoints))

    def _put(self, pod: str, item: _Item) -> bool:
        q = self._shard(pod)
        size = 0 if isinstance(item, Resync) else len(item[3])
        if size and self.queued_bytes + size > self.cfg.max_queued_bytes:
            # A flood of large batches (or one forged in central-bind mode) must not queue without bound.
            self._drop("queue_bytes", f"KV-event queues hold {self.queued_bytes} bytes: dropping a {size}-byte batch")
            return False
        try:
            q.put_nowait(item)
        except asyncio.QueueFull:
            self._drop("queue_full", f"KV-event queue full ({q.maxsize}): dropping")
            return False
        self.queued_bytes += size
        return True

    def _drop(self, reason: str, why: str) -> None:
        self.metrics.dropped.labels(reason).inc()
        now = time.monotonic()
        if now - self._last_drop_log > 5.0:
            self._last_drop_log = now
            log.warning("%s; the gap will be replayed", why)

    # ------------------------------------------------------------ applying
    async def _worker(self, q: asyncio.Queue[_Item]) -> None:
        while True:
            item = await q.get()
            pod = item.pod if isinstance(item, Resync) else item[0]
            if not isinstance(item, Resync):
                self.queued_bytes -= len(item[3])
            try:
                if isinstance(item, Resync):
                    await self.process_resync(item)
                else:
                    await self.process(*item)
            except Exception:
                log.exception("KV events: failed to apply a batch from %s", pod)
            finally:
                q.task_done()
            await asyncio.sleep(0)

    async def process(self, pod: str, model: str, seq: int, payload: bytes, replay: str | None) -> None:
        """Check one live batch's seq, replay what is missing before it, then apply it (a large one with the
        cyclic GC paused, see `gc_paused`)."""
        if len(payload) <= STEP_BYTES:
            await self._process(pod, model, seq, payload, replay)
            return
        with gc_paused():
            await self._process(pod, model, seq, payload, replay)

    async def _process(self, pod: str, model: str, seq: int, payload: bytes, replay: str | None) -> None:
        batch = await self.decode_sliced(pod, payload)
        rank = (batch.dp_rank or 0) if batch is not None else self._sole_rank(pod)
        if self.seq.last(pod, rank) is None and len(self.seq.ranks(pod)) >= MAX_RANKS_PER_POD:
            # Room for the new rank: forget the one applied longest ago, so forged ranks cannot lock a real one out
            # (a forgotten real rank rejoins, replayed, with its next batch).
            old = self.seq.forget_least_recent_rank(pod)
            self.metrics.evicted.labels("rank").inc()
            _throttle.log(
                log, logging.WARNING, "too_many_ranks", "KV events: %s has %d ranks; forgetting rank %s, the least "
                "recent, for rank %d", pod, MAX_RANKS_PER_POD, old, rank,
            )  # fmt: skip
        v = self.seq.check(pod, rank, seq)
        self.metrics.sequence.labels(v.value).inc()
        if v is Verdict.DUPLICATE:
            return
        if v is Verdict.RESTART and replay and self.seq.last(pod, rank) is not None:
            # A live seq going back: ask the publisher before clearing anything. Its replay from our last applied
            # batch says whether it restarted; if it did not, this message is forged or stale (central bind lets
            # anyone send any topic) and must not wipe the pod.
            last = self.seq.last(pod, rank)
            assert last is not None
            restarted = await self.replayer.replay(pod, model, rank, replay, last + 1)
            if restarted is False:
                self.metrics.dropped.labels("rewound").inc()
                _throttle.log(
                    log, logging.WARNING, "rewound", "KV events: dropping a batch from %s rank %d with seq %d below "
                    "the stream's: its publisher did not restart", pod, rank, seq,
                )  # fmt: skip
                return
            if restarted:  # the replay cleared the pod and refilled it from 0: judge this batch afresh
                v = self.seq.check(pod, rank, seq)
                if v is Verdict.DUPLICATE:
                    await self.flush()
                    return
        if v is Verdict.RESTART:
            log.warning("KV events: %s rank %d restarted (seq %d); clearing its blocks", pod, rank, seq)
            self.applier.clear_pod(pod)
            self.seq.restarted(pod, rank, seq)
            v = Verdict.APPLY if seq == 0 else Verdict.JOIN
        if v is not Verdict.APPLY:
            last = self.seq.last(pod, rank)
            start = 0 if last is None else last + 1
            if v is Verdict.GAP:
                log.log(V(DEFAULT), "KV events: gap from %s rank %d: have %s, got %d", pod, rank, last, seq)
            if replay:
                await self.replayer.replay(pod, model, rank, replay, start)
            last = self.seq.last(pod, rank)
            if last is not None and seq <= last:
                await self.flush()
                return
        if batch is not None:
            await self.apply_sliced(pod, model, batch)
        self.seq.applied(pod, rank, seq, await crc32_sliced(payload))
        await self.flush()

    async def process_resync(self, r: Resync) -> None:
        """For each rank the pod's batches carried (normally the one DP rank of its publisher, whatever its
        number), replay from after the last applied batch, checking the publisher against that rank's checkpoint;
        a pod with nothing applied yet replays from 0."""
        checkpoints = {c.rank: c for c in r.checkpoints}
        for rank in sorted(set(checkpoints) | set(self.seq.ranks(r.pod))) or [0]:
            last = self.seq.last(r.pod, rank)
            checkpoint = checkpoints.get(rank) if last is not None else None
            start = 0 if last is None else last + 1
            await self.replayer.replay(r.pod, self.cfg.default_model, rank, r.endpoint, start, checkpoint)
        await self.flush()

    def _sole_rank(self, pod: str) -> int:
        """The rank to file an undecodable batch under: the pod's only rank when it has one, else 0."""
        ranks = self.seq.ranks(pod)
        return ranks[0] if len(ranks) == 1 else 0

    # ------------------------------------------------------------ BatchSink (live batches and replays)
    def decode(self, pod: str, payload: bytes) -> EventBatch | None:
        try:
            return decode_batch(payload)
        except DecodeError as e:
            self._decode_failed(pod, e)
            return None

    async def decode_sliced(self, pod: str, payload: bytes) -> EventBatch | None:
        """`decode`, yielding to the event loop every STEP_BYTES of a large payload: one engine batch can be
        megabytes (131,072 blocks with their token ids: 9 MiB, ~0.3 s to unpack in one piece)."""
        if len(payload) <= STEP_BYTES:
            return self.decode(pod, payload)
        try:
            for obj in unpack_steps(payload):
                if obj is None:
                    await asyncio.sleep(0)
                    continue
                await asyncio.sleep(0)
                for _ in mask_steps(obj):
                    await asyncio.sleep(0)
                return batch_from_raw(obj)
        except DecodeError as e:
            self._decode_failed(pod, e)
        return None

    def _decode_failed(self, pod: str, e: DecodeError) -> None:
        self.metrics.decode_errors.inc()
        _throttle.log(log, logging.WARNING, "decode", "KV events: bad payload from %s: %s", pod, e)

    def apply(self, pod: str, model: str, batch: EventBatch) -> None:
        st = self.applier.apply(pod, model, batch)
        self.stats.add(st)
        m = self.metrics
        if st.stored_blocks:
            m.blocks.labels("stored").inc(st.stored_blocks)
        if st.removed_blocks:
            m.blocks.labels("removed").inc(st.removed_blocks)
        if st.clears:
            m.blocks.labels("cleared").inc(st.clears)
        if st.skipped_parent:
            m.skipped.labels("unknown_parent").inc(st.skipped_parent)
        if st.skipped_group:
            m.skipped.labels("group").inc(st.skipped_group)
        if st.bad_events:
            m.skipped.labels("bad_event").inc(st.bad_events)
        for reason in ("block_size", "hashes", "budget", "rate"):
            n = getattr(st, "refused_" + reason)
            if n:
                m.skipped.labels("too_many_hashes" if reason == "hashes" else reason).inc(n)
        if st.unknown_removals:
            m.skipped.labels("unknown_removal").inc(st.unknown_removals)
        if batch.unknown:
            m.skipped.labels("unknown_event").inc(batch.unknown)
        if self.on_applied is not None:
            self.on_applied(pod, st)

    async def apply_sliced(self, pod: str, model: str, batch: EventBatch) -> None:
        """Apply a batch in slices of at most SLICE_BLOCKS blocks, yielding to the event loop between them; then
        empty its long lists a slice at a time (freeing two million token ids at once stalls the loop ~0.1 s)."""
        first = True
        for part in slice_batch(batch):
            if not first:
                await asyncio.sleep(0)
            first = False
            self.apply(pod, model, part)
        for ev in batch.events:
            for items in long_lists(ev):
                while len(items) > RELEASE_STEP:
                    del items[-RELEASE_STEP:]
                    await asyncio.sleep(0)

    def clear_pod(self, pod: str) -> None:
        self.applier.clear_pod(pod)

    async def flush(self) -> None:
        await self.index.flush()
