"""The KV-event pool: ZMQ subscribers feeding sharded workers that apply events to the index.

Topologies: per-pod dialing (a SUB per discovered endpoint, following the Datastore through its
listener interface) and central bind (one SUB the publishers connect to; the pod comes from the topic
`kv@<pod>@<model>`). Frames must be exactly `[topic, seq (8 bytes big-endian), payload]`.
Each pod is hashed to one worker (per-pod order); queues are bounded and a full queue drops the message
(counted, logged, and later repaired by the gap replay it causes). Workers yield to the event loop after
every batch, so the request path never waits behind a burst of events.
Everything runs on the server's asyncio loop (pyzmq's asyncio sockets); nothing here knows of gRPC.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
import zlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import zmq
import zmq.asyncio

from epp.framework.params import Params
from epp.framework.state import DataKey
from epp.framework.types import Endpoint
from epp.kvcache.events import DecodeError, EventBatch, decode_batch, parse_topic
from epp.kvcache.ingest import ApplyStats, EventApplier
from epp.kvcache.metrics import PoolMetrics, default_metrics
from epp.kvcache.sequencing import SequenceTracker, Verdict

log = logging.getLogger(__name__)

END_SEQ = (-1).to_bytes(8, "big", signed=True)
PROACTIVE = -1  # queue item seq: replay everything the publisher still buffers
# Endpoint.attributes: the full ZMQ address of the endpoint's PUB socket, and of its ROUTER replay socket.
EVENTS_ENDPOINT_ATTR = DataKey[str]("kv-events-endpoint")
REPLAY_ENDPOINT_ATTR = DataKey[str]("kv-events-replay-endpoint")
EVENTS_PORT_LABEL = "kv-events.pyepp.io/port"
REPLAY_PORT_LABEL = "kv-events.pyepp.io/replay-port"
_RANK_RE = re.compile(r"-rank-(\d+)$")


@dataclass
class PoolConfig:
    zmq_endpoint: str | None = None  # central-bind mode, e.g. tcp://*:5557
    topic_filter: str = "kv@"
    concurrency: int = 4
    engine_type: str = "vllm"  # "vllm" | "sglang" (same decoder; SGLang replays [seq, payload])
    discover_pods: bool = True
    socket_port: int = 5557
    replay_port: int | None = None
    queue_size: int = 10_000  # per shard
    default_model: str = ""  # model for topics that do not name one
    replay_idle_timeout: float = 2.0
    replay_timeout: float = 60.0
    replay_cooldown: float = 30.0  # after a failed replay, no replays from that endpoint for this long
    max_concurrent_replays: int = 8
    retry_interval: float = 5.0

    @classmethod
    def from_params(cls, p: Params) -> PoolConfig:
        """llm-d's kvEventsConfig keys (podDiscoveryConfig nested or flat)."""
        disc = p.section("podDiscoveryConfig")

        def port(*keys: str) -> int | None:
            for src in (disc, p):
                for k in keys:
                    if src.has(k):
                        return src.int(k, 0, min=0, max=65535)
            return None

        replay = port("replaySocketPort", "kvEventsReplayPort")
        return cls(
            zmq_endpoint=p.optional_str("zmqEndpoint") or None,
            topic_filter=p.str("topicFilter", "kv@"),
            concurrency=p.int("concurrency", 4, min=1),
            engine_type=p.str("engineType", "vllm").lower(),
            discover_pods=p.bool("discoverPods", True),
            socket_port=port("socketPort", "kvEventsPort") or 5557,
            replay_port=replay,
            queue_size=p.int("queueSize", 10_000, min=1),
            default_model=p.optional_str("modelName") or p.str("defaultModel", ""),
        )


def endpoint_rank(ep: Endpoint) -> int:
    m = _RANK_RE.search(ep.name)
    return int(m.group(1)) if m else 0


def event_endpoints(ep: Endpoint, cfg: PoolConfig) -> tuple[str, str | None]:
    """Where `ep` publishes: an attribute, else a port label, else the configured port + the DP rank."""
    rank = endpoint_rank(ep)
    host = f"[{ep.address}]" if ":" in ep.address else ep.address
    pub = ep.attributes.get(EVENTS_ENDPOINT_ATTR)
    if not pub:
        port = int(ep.labels.get(EVENTS_PORT_LABEL, cfg.socket_port + rank))
        pub = f"tcp://{host}:{port}"
    replay = ep.attributes.get(REPLAY_ENDPOINT_ATTR)
    if not replay:
        rp = ep.labels.get(REPLAY_PORT_LABEL)
        if rp is not None:
            replay = f"tcp://{host}:{int(rp)}"
        elif cfg.replay_port is not None:
            replay = f"tcp://{host}:{cfg.replay_port + rank}"
    return str(pub), (str(replay) if replay else None)


_Item = tuple[str, str, int, bytes, str | None]  # pod, model, seq, payload, replay endpoint


class EventPool:
    """Owns the subscribers and workers; `run()` is the background coroutine the server starts."""

    def __init__(
        self,
        applier: EventApplier,
        config: PoolConfig | None = None,
        metrics: PoolMetrics | None = None,
        on_applied: Callable[[str, ApplyStats], None] | None = None,
    ) -> None:
        self.applier = applier
        self.index = applier.index
        self.cfg = config or PoolConfig()
        self.metrics = metrics or default_metrics()
        self.on_applied = on_applied
        self.seq = SequenceTracker()
        self.stats = ApplyStats()
        self._ctx = zmq.asyncio.Context.instance()
        self._queues = [asyncio.Queue[_Item](self.cfg.queue_size) for _ in range(self.cfg.concurrency)]
        self._shard_of: dict[str, int] = {}
        self._subs: dict[str, tuple[str, str | None, asyncio.Task[None] | None]] = {}  # pod -> (pub, replay, task)
        self._replay_eps: dict[str, str | None] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._replay_sem = asyncio.Semaphore(self.cfg.max_concurrent_replays)
        self._replay_failed: dict[str, float] = {}  # endpoint -> monotonic time of the last failure
        self._last_drop_log = 0.0
        self._started = asyncio.Event()
        self.metrics.capacity.set(self.cfg.queue_size * self.cfg.concurrency)
        self.metrics.queue_depth.set_function(lambda: sum(q.qsize() for q in self._queues))

    # ------------------------------------------------------------ discovery (Datastore listener)
    def endpoint_added(self, ep: Endpoint) -> None:
        pub, replay = event_endpoints(ep, self.cfg)
        self._replay_eps[ep.hostport] = replay
        if not self.cfg.discover_pods:
            return
        cur = self._subs.get(ep.hostport)
        if cur is not None and cur[0] == pub and cur[1] == replay:
            return
        self._stop_sub(ep.hostport)
        task = self._loop.create_task(self._subscribe(ep.hostport, pub, replay)) if self._loop else None
        self._subs[ep.hostport] = (pub, replay, task)

    def endpoint_removed(self, ep: Endpoint) -> None:
        self._stop_sub(ep.hostport)
        self._subs.pop(ep.hostport, None)
        self._replay_eps.pop(ep.hostport, None)
        self.applier.clear_pod(ep.hostport)
        self.seq.forget_pod(ep.hostport)

    def _stop_sub(self, pod: str) -> None:
        cur = self._subs.get(pod)
        if cur is not None and cur[2] is not None:
            cur[2].cancel()

    # ------------------------------------------------------------ lifecycle
    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._tasks = [asyncio.create_task(self._worker(q)) for q in self._queues]
        for pod, (pub, replay, task) in list(self._subs.items()):
            if task is None:
                self._subs[pod] = (pub, replay, asyncio.create_task(self._subscribe(pod, pub, replay)))
        if self.cfg.zmq_endpoint:
            self._tasks.append(asyncio.create_task(self._central(self.cfg.zmq_endpoint)))
        self._started.set()
        try:
            await asyncio.Event().wait()
        finally:
            for t in self._tasks + [s[2] for s in self._subs.values() if s[2] is not None]:
                t.cancel()
            for t in self._tasks:
                with contextlib.suppress(BaseException):
                    await t

    async def started(self) -> None:
        await self._started.wait()

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
            log.warning("dropping KV-event message with %d frames (want 3) from %s", len(frames), source_pod or "?")
            return False
        topic, seqb, payload = frames
        if len(seqb) != 8:
            m.zmq_errors.labels("seq").inc()
            log.warning("dropping KV-event message with a %d-byte sequence frame from %s", len(seqb), source_pod)
            return False
        tpod, model = parse_topic(topic)
        pod = source_pod or tpod
        if not pod:
            m.dropped.labels("no_pod").inc()
            log.warning("dropping KV-event message: topic %r names no pod", topic[:80])
            return False
        if replay is None and source_pod is None:
            replay = self._replay_eps.get(pod)
        q = self._shard(pod)
        try:
            q.put_nowait((pod, model or self.cfg.default_model, int.from_bytes(seqb, "big"), payload, replay))
        except asyncio.QueueFull:
            m.dropped.labels("queue_full").inc()
            now = time.monotonic()
            if now - self._last_drop_log > 5.0:
                self._last_drop_log = now
                log.warning("KV-event queue full (%d): dropping; the gap will be replayed", q.maxsize)
            return False
        return True

    async def _recv_loop(self, sock: zmq.asyncio.Socket, source_pod: str | None, replay: str | None) -> None:
        n = 0
        while True:
            frames = await sock.recv_multipart()
            self.submit(frames, source_pod, replay)
            n += 1
            if n % 32 == 0:
                await asyncio.sleep(0)  # a ready socket never suspends; let workers and requests run

    async def _subscribe(self, pod: str, endpoint: str, replay: str | None) -> None:
        first = True
        while True:
            sock = self._ctx.socket(zmq.SUB)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.RCVHWM, 100_000)
            sock.setsockopt_string(zmq.SUBSCRIBE, self.cfg.topic_filter)
            connected = asyncio.Event()
            mon = sock.get_monitor_socket(zmq.EVENT_CONNECTED)  # before connect, or the event is missed
            monitor = asyncio.create_task(self._monitor(sock, mon, connected))
            self.metrics.active.inc()
            proactive: asyncio.Task[None] | None = None
            try:
                sock.connect(endpoint)
                if replay:
                    proactive = asyncio.create_task(self._proactive_replay(pod, replay, connected))
                if not first:
                    self.metrics.reconnections.inc()
                first = False
                log.info("KV events: subscribed to %s for %s", endpoint, pod)
                await self._recv_loop(sock, pod, replay)
            except asyncio.CancelledError:
                raise
            except zmq.ZMQError as e:
                self.metrics.zmq_errors.labels("socket").inc()
                log.warning("KV events: subscriber for %s (%s) failed: %s; retrying", pod, endpoint, e)
            finally:
                self.metrics.active.dec()
                monitor.cancel()
                if proactive is not None:
                    proactive.cancel()
                sock.close(linger=0)
            await asyncio.sleep(self.cfg.retry_interval)

    async def _proactive_replay(self, pod: str, replay: str, connected: asyncio.Event) -> None:
        """On every (re)connect, fetch what the publisher sent while we were not subscribed (llm-d replays on
        connect); after a reconnect this also detects a restarted publisher (see `_replay`)."""
        while True:
            await connected.wait()
            connected.clear()
            # What we had applied before this connection: the publisher's copy of that batch tells whether it
            # restarted. Checking the newest batch instead would miss a restart whose first batches were lost
            # before the subscription caught up (its later seqs then look like a continuation of the old ones).
            last, crc = self.seq.last(pod, 0), self.seq.last_crc(pod, 0)
            checkpoint = b"" if last is None else last.to_bytes(8, "big") + (crc or 0).to_bytes(4, "big")
            await asyncio.sleep(0.05)  # let the subscription reach the publisher first
            try:
                self._shard(pod).put_nowait((pod, self.cfg.default_model, PROACTIVE, checkpoint, replay))
            except asyncio.QueueFull:
                self.metrics.dropped.labels("queue_full").inc()

    async def _monitor(self, sock: zmq.asyncio.Socket, mon: zmq.asyncio.Socket, connected: asyncio.Event) -> None:
        """Count libzmq's own reconnects (the TCP link dropping and coming back)."""
        from zmq.utils.monitor import parse_monitor_message

        connects = 0
        try:
            while True:
                msg = parse_monitor_message(await mon.recv_multipart())
                if msg["event"] == zmq.EVENT_CONNECTED:
                    connected.set()
                    connects += 1
                    if connects > 1:
                        self.metrics.reconnections.inc()
        except (asyncio.CancelledError, zmq.ZMQError):
            pass
        finally:
            with contextlib.suppress(zmq.ZMQError):
                sock.disable_monitor()
            mon.close(linger=0)

    async def _central(self, endpoint: str) -> None:
        sock = self._ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, 100_000)
        sock.setsockopt_string(zmq.SUBSCRIBE, self.cfg.topic_filter)
        sock.bind(endpoint)
        self.bound_endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        log.info("KV events: listening on %s", self.bound_endpoint)
        self.metrics.active.inc()
        try:
            await self._recv_loop(sock, None, None)
        finally:
            self.metrics.active.dec()
            sock.close(linger=0)

    # ------------------------------------------------------------ applying
    async def _worker(self, q: asyncio.Queue[_Item]) -> None:
        while True:
            item = await q.get()
            try:
                await self._process(*item)
            except Exception:
                log.exception("KV events: failed to apply a batch from %s", item[0])
            finally:
                q.task_done()
            await asyncio.sleep(0)

    def _decode(self, pod: str, payload: bytes) -> EventBatch | None:
        try:
            return decode_batch(payload)
        except DecodeError as e:
            self.metrics.decode_errors.inc()
            log.warning("KV events: bad payload from %s: %s", pod, e)
            return None

    def _apply(self, pod: str, model: str, batch: EventBatch) -> None:
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
        if st.unknown_removals:
            m.skipped.labels("unknown_removal").inc(st.unknown_removals)
        if batch.unknown:
            m.skipped.labels("unknown_event").inc(batch.unknown)
        if self.on_applied is not None:
            self.on_applied(pod, st)

    async def _process(self, pod: str, model: str, seq: int, payload: bytes, replay: str | None) -> None:
        if seq == PROACTIVE:
            if replay:
                last = self.seq.last(pod, 0)
                checkpoint = None
                if len(payload) == 12 and last is not None:
                    checkpoint = (int.from_bytes(payload[:8], "big"), int.from_bytes(payload[8:], "big"))
                await self._replay(pod, model, 0, replay, 0 if last is None else last + 1, checkpoint)
                await self.index.flush()
            return
        batch = self._decode(pod, payload)
        rank = (batch.dp_rank or 0) if batch is not None else 0
        v = self.seq.check(pod, rank, seq)
        self.metrics.sequence.labels(v.value).inc()
        if v is Verdict.DUPLICATE:
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
                log.info("KV events: gap from %s rank %d: have %s, got %d", pod, rank, last, seq)
            if replay:
                await self._replay(pod, model, rank, replay, start)
            last = self.seq.last(pod, rank)
            if last is not None and seq <= last:
                await self.index.flush()
                return
        if batch is not None:
            self._apply(pod, model, batch)
        self.seq.applied(pod, rank, seq, zlib.crc32(payload))
        await self.index.flush()

    async def _replay(
        self, pod: str, model: str, rank: int, endpoint: str, start: int, checkpoint: tuple[int, int] | None = None
    ) -> None:
        """Ask the publisher's ROUTER for batches from `start`; apply those we have not applied, in order.

        When we already applied batches of this rank, the request starts one batch early so the publisher's
        copy of our last batch can be compared with what we applied: a different payload, or nothing at all
        at or after that seq, means the publisher restarted (its numbering began again) — the pod is then
        cleared and replayed from 0. `checkpoint` (seq, crc) names the batch to compare instead: a reconnect
        compares a batch applied before the connection.
        """
        failed = self._replay_failed.get(endpoint)
        if failed is not None and time.monotonic() - failed < self.cfg.replay_cooldown:
            self.metrics.replays.labels("cooldown").inc()
            return
        last = self.seq.last(pod, rank)
        expect: int | None = None
        if checkpoint is not None:
            start, expect = checkpoint
        elif last is not None and start == last + 1:
            start, expect = last, self.seq.last_crc(pod, rank) or 0
        result, got, restarted = await self._fetch(pod, model, rank, endpoint, start, expect)
        if restarted:
            log.warning("KV events: %s rank %d restarted (replay does not match); clearing its blocks", pod, rank)
            self.metrics.sequence.labels("restart").inc()
            self.applier.clear_pod(pod)
            self.seq.forget_pod(pod)
            result, got, _ = await self._fetch(pod, model, rank, endpoint, 0, None)
        self.metrics.replays.labels(result).inc()
        if result == "ok":
            self._replay_failed.pop(endpoint, None)
        else:
            self._replay_failed[endpoint] = time.monotonic()
        log.info("KV events: replay for %s from seq %d: %s, %d batches", pod, start, result, got)

    async def replay_frames(self, endpoint: str, start: int) -> AsyncIterator[list[bytes]]:
        """The publisher's replay of batches from `start`, as frame lists without the DEALER delimiter.

        Ends after the END marker (which it yields); raises TimeoutError when the publisher goes quiet.
        """
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, 0)
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
        async with self._replay_sem:
            try:
                async for frames in self.replay_frames(endpoint, start):
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
                    batch = self._decode(pod, payload)
                    r = (batch.dp_rank or 0) if batch is not None else rank
                    if self.seq.check(pod, r, s, live=False) is Verdict.DUPLICATE:
                        continue
                    if batch is not None:
                        self._apply(pod, model, batch)
                    self.seq.applied(pod, r, s, crc)
                    got += 1
                    if got % 64 == 0:
                        await self.index.flush()
                        await asyncio.sleep(0)
            except TimeoutError:
                return "timeout", got, False
            except zmq.ZMQError as e:
                log.warning("KV events: replay from %s failed: %s", endpoint, e)
                return "error", got, False
        return "ok", got, False
