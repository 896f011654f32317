"""ZMQ subscriptions to the engines' KV-event publishers, following the Datastore.

Per-pod dialing: one SUB per discovered endpoint, at the address `event_endpoints` gives (an attribute, a port
label, or the configured port plus the endpoint's DP rank), opened on endpoint_added, moved when an
endpoint_updated changes that address, and closed on endpoint_removed. Central bind: one SUB the publishers
connect to; the pod comes from the topic `kv@<pod>@<model>`. A socket monitor counts libzmq's reconnects, and
every (re)connect of a pod with a replay socket queues a resync, so the workers replay what the publisher sent
while we were not subscribed (and notice a publisher that restarted meanwhile). Frames go to the workers as
received; they validate them.

`epp serve --workers N` subscribes to each publisher once whatever N is: worker 0's subscriptions hand every frame
to `tap` (the workers' feed, epp.wiring.feed); the other workers' are `fed`: they follow the endpoints as usual
(addresses, replay sockets, known pods) but open no socket, and `receive` the frames the feed brings into their
own shard workers and index (one index per worker). `fed_connected` has them replay what they missed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass

import zmq
import zmq.asyncio

from epp.framework.state import DataKey
from epp.framework.types import Endpoint
from epp.framework.verbosity import DEFAULT, V
from epp.kvcache.config import PoolConfig
from epp.kvcache.metrics import PoolMetrics
from epp.kvcache.workers import ShardedWorkers

log = logging.getLogger(__name__)

# Endpoint.attributes: the full ZMQ address of the endpoint's PUB socket, and of its ROUTER replay socket.
EVENTS_ENDPOINT_ATTR = DataKey[str]("kv-events-endpoint")
REPLAY_ENDPOINT_ATTR = DataKey[str]("kv-events-replay-endpoint")
EVENTS_PORT_LABEL = "kv-events.pyepp.io/port"
REPLAY_PORT_LABEL = "kv-events.pyepp.io/replay-port"
_RANK_RE = re.compile(r"-rank-(\d+)$")

# A received frame as the workers' feed carries it: (the pod it came from, "" in central mode; its replay
# socket, "" for none; the ZMQ frames).
FrameTap = Callable[[str, str, list[bytes]], None]


def endpoint_rank(ep: Endpoint) -> int:
    m = _RANK_RE.search(ep.name)
    return int(m.group(1)) if m else 0


@dataclass(frozen=True, slots=True)
class EventEndpoints:
    pub: str | None  # the PUB socket to subscribe to; None: do not subscribe
    replay: str | None  # the ROUTER replay socket; None: no replay
    bad_labels: tuple[tuple[str, str], ...] = ()  # (label, value) pairs whose value is not a port


def event_endpoints(ep: Endpoint, cfg: PoolConfig) -> EventEndpoints:
    """Where `ep` publishes: an attribute, else a port label, else the configured port + the DP rank.

    A port label that is not a port (1-65535) disables what it names (the subscription, or the replay) instead
    of falling back to the configured port: an endpoint labelled with its own port publishes elsewhere than the
    default (e.g. two engines sharing an address), so the default port may be another engine's, whose blocks
    would then be filed under this pod and attract its requests. Without a subscription the pod only loses its
    precise prefix score until the label is fixed, which arrives as an update.
    """
    rank = endpoint_rank(ep)
    host = f"[{ep.address}]" if ":" in ep.address else ep.address
    bad: list[tuple[str, str]] = []

    def address(label: str, default: int | None) -> str | None:
        value = ep.labels.get(label)
        if value is None:
            return None if default is None else f"tcp://{host}:{default}"
        port = int(value) if value.strip().isdecimal() else 0
        if not 0 < port < 65536:
            bad.append((label, value))
            return None
        return f"tcp://{host}:{port}"

    pub = ep.attributes.get(EVENTS_ENDPOINT_ATTR) or address(EVENTS_PORT_LABEL, cfg.socket_port + rank)
    replay = ep.attributes.get(REPLAY_ENDPOINT_ATTR) or address(
        REPLAY_PORT_LABEL, None if cfg.replay_port is None else cfg.replay_port + rank
    )
    return EventEndpoints(pub, replay, tuple(bad))


async def drain_socket(sock: zmq.asyncio.Socket, handle: Callable[[list[bytes]], None]) -> None:
    """Each wake-up of the socket's FD drains every message it holds, received without blocking on a plain shadow
    of the socket, each handed to `handle`. zmq.asyncio's `recv_multipart` costs a future and a reader added and
    removed per message, and an engine publishes a batch for every request it serves (the loop CPU per batch is
    measured by `bench_kvcache.bench_receive`, docs/benchmarks.md). Runs until cancelled."""
    raw: zmq.Socket[bytes] = zmq.Socket.shadow(sock.underlying)
    fd = int(raw.getsockopt(zmq.FD))
    loop = asyncio.get_running_loop()
    readable = asyncio.Event()
    loop.add_reader(fd, readable.set)
    noblock = zmq.NOBLOCK

    def pending() -> bool:
        # The FD only says that the socket's state changed: ZMQ_EVENTS says whether a message is there.
        return bool(int(raw.getsockopt(zmq.EVENTS)) & zmq.POLLIN)

    n = 0
    try:
        while True:
            while pending():
                try:
                    frames = raw.recv_multipart(noblock)
                except zmq.Again:
                    break
                handle(frames)
                n += 1
                if n % 32 == 0:
                    await asyncio.sleep(0)  # a ready socket never suspends; let workers and requests run
            readable.clear()
            if not pending():  # (checking consumed the FD's signal: nothing is lost)
                await readable.wait()
    finally:
        loop.remove_reader(fd)


class Subscriptions:
    """The Datastore listener of the KV-event pool: owns the SUB sockets, hands frames to the workers."""

    def __init__(self, cfg: PoolConfig, workers: ShardedWorkers, metrics: PoolMetrics) -> None:
        self.cfg = cfg
        self.workers = workers
        self.metrics = metrics
        self.bound_endpoint: str | None = None  # central bind: the address actually bound
        self._ctx = zmq.asyncio.Context.instance()
        self._subs: dict[str, tuple[str, str | None, asyncio.Task[None] | None]] = {}  # pod -> (pub, replay, task)
        self._tasks: list[asyncio.Task[None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self.tap: FrameTap | None = None  # told every frame received (worker 0 of `--workers`: the feed)
        self.fed = False  # no sockets: the frames come through `receive` (the other workers of `--workers`)
        self._fed_up = False  # fed: the feed is connected
        if cfg.zmq_endpoint:  # central bind: accept topics of the pool's endpoints only
            workers.known_pods = set()

    # ------------------------------------------------------------ Datastore listener
    def endpoint_added(self, ep: Endpoint) -> None:
        self._follow(ep)

    def endpoint_updated(self, ep: Endpoint) -> None:
        self._follow(ep)

    def endpoint_removed(self, ep: Endpoint) -> None:
        if self.workers.known_pods is not None:
            self.workers.known_pods.discard(ep.hostport)
        self._stop_sub(ep.hostport)
        self._subs.pop(ep.hostport, None)
        self.workers.forget(ep.hostport)

    def _follow(self, ep: Endpoint) -> None:
        """Subscribe to where `ep` publishes now. Another PUB address (or none) means another publisher: the
        blocks and sequence numbers we hold came from the old one, so the pod starts over (its new subscription
        replays from 0). Only a new replay address keeps them."""
        eps = event_endpoints(ep, self.cfg)
        for label, value in eps.bad_labels:
            self.metrics.config_errors.labels("bad_port_label").inc()
            what = "not subscribing to its KV events" if label == EVENTS_PORT_LABEL else "no KV-event replay"
            log.warning(
                "KV events: endpoint %s (%s) has %s=%r, not a port: %s", ep.name, ep.hostport, label, value, what
            )
        pod = ep.hostport
        if self.workers.known_pods is not None:
            self.workers.known_pods.add(pod)
        cur = self._subs.get(pod)
        if cur is not None and cur[0] != eps.pub:
            self._stop_sub(pod)
            del self._subs[pod]
            self.workers.forget(pod)
            cur = None
        self.workers.set_replay_endpoint(pod, eps.replay)
        self.workers.applier.guard.endpoints[pod] = ep  # its scraped facts (block size) check its events
        if not self.cfg.discover_pods or eps.pub is None or (cur is not None and cur[1] == eps.replay):
            return
        if self.fed:
            self._subs[pod] = (eps.pub, eps.replay, None)
            if self._fed_up and eps.replay:  # what it published before this worker followed it
                self.workers.resync(pod, eps.replay, self.workers.checkpoints(pod))
            return
        self._stop_sub(pod)
        task = self._loop.create_task(self._subscribe(pod, eps.pub, eps.replay)) if self._loop else None
        self._subs[pod] = (eps.pub, eps.replay, task)

    def _stop_sub(self, pod: str) -> None:
        cur = self._subs.get(pod)
        if cur is not None and cur[2] is not None:
            cur[2].cancel()

    # ------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Open the subscriptions of the endpoints added so far (and the central socket); later ones open at once."""
        self._loop = asyncio.get_running_loop()
        if self.fed:
            return
        for pod, (pub, replay, task) in list(self._subs.items()):
            if task is None:
                self._subs[pod] = (pub, replay, asyncio.create_task(self._subscribe(pod, pub, replay)))
        if self.cfg.zmq_endpoint:
            self._tasks.append(asyncio.create_task(self._central(self.cfg.zmq_endpoint)))

    async def stop(self) -> None:
        tasks = self._tasks + [s[2] for s in self._subs.values() if s[2] is not None]
        for t in tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(BaseException):
                await t
        self._tasks = []

    # ------------------------------------------------------------ fed (the workers' feed)
    def receive(self, pod: str, replay: str, frames: list[bytes]) -> bool:
        """Frames another worker received from `pod`'s publisher ("": its central socket), into this worker's
        shards (which validate them as their own). False when this worker does not follow `pod` (not discovered
        here yet, or gone)."""
        if pod:
            cur = self._subs.get(pod)
            if cur is None:
                return False
            replay = cur[1] or ""  # this worker's view of the pod's replay socket
        self.workers.submit(frames, pod or None, replay or None)
        return True

    def fed_connected(self) -> None:
        """The feed (re)connected: what the publishers sent while this worker had no feed (all of it, for a worker
        just started) is replayed from each pod's replay socket, as on a subscription's (re)connect; so is a pod
        followed later, at once."""
        self._fed_up = True
        for pod, (_, replay, _) in list(self._subs.items()):
            if replay:
                self.workers.resync(pod, replay, self.workers.checkpoints(pod))

    def fed_disconnected(self) -> None:
        self._fed_up = False

    # ------------------------------------------------------------ receiving
    async def _recv_loop(self, sock: zmq.asyncio.Socket, source_pod: str | None, replay: str | None) -> None:
        def handle(frames: list[bytes]) -> None:
            self.workers.submit(frames, source_pod, replay)
            if self.tap is not None:  # (read per message: the feed may attach after the loop starts)
                self.tap(source_pod or "", replay or "", frames)

        await drain_socket(sock, handle)

    async def _subscribe(self, pod: str, endpoint: str, replay: str | None) -> None:
        first = True
        while True:
            sock = self._ctx.socket(zmq.SUB)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.RCVHWM, 100_000)
            sock.setsockopt(zmq.MAXMSGSIZE, self.cfg.max_message_bytes)
            sock.setsockopt_string(zmq.SUBSCRIBE, self.cfg.topic_filter)
            connected = asyncio.Event()
            mon = sock.get_monitor_socket(zmq.EVENT_CONNECTED)  # before connect, or the event is missed
            monitor = asyncio.create_task(self._monitor(sock, mon, connected))
            self.metrics.active.inc()
            resync: asyncio.Task[None] | None = None
            try:
                sock.connect(endpoint)
                if replay:
                    resync = asyncio.create_task(self._resync_on_connect(pod, replay, connected))
                if not first:
                    self.metrics.reconnections.inc()
                first = False
                log.log(V(DEFAULT), "KV events: subscribed to %s for %s", endpoint, pod)
                await self._recv_loop(sock, pod, replay)
            except asyncio.CancelledError:
                raise
            except zmq.ZMQError as e:
                self.metrics.zmq_errors.labels("socket").inc()
                log.warning("KV events: subscriber for %s (%s) failed: %s; retrying", pod, endpoint, e)
            finally:
                self.metrics.active.dec()
                monitor.cancel()
                if resync is not None:
                    resync.cancel()
                sock.close(linger=0)
            await asyncio.sleep(self.cfg.retry_interval)

    async def _resync_on_connect(self, pod: str, replay: str, connected: asyncio.Event) -> None:
        """On every (re)connect, have the workers fetch what the publisher sent while we were not subscribed
        (llm-d replays on connect); after a reconnect this also detects a restarted publisher."""
        while True:
            await connected.wait()
            connected.clear()
            # What we had applied before this connection: the publisher's copy of that batch tells whether it
            # restarted. Checking the newest batch instead would miss a restart whose first batches were lost
            # before the subscription caught up (its later seqs then look like a continuation of the old ones).
            checkpoints = self.workers.checkpoints(pod)
            await asyncio.sleep(0.05)  # let the subscription reach the publisher first
            self.workers.resync(pod, replay, checkpoints)

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
        sock.setsockopt(zmq.MAXMSGSIZE, self.cfg.max_message_bytes)
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
