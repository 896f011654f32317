"""The workers' feed (`epp serve --workers N`): each pod is scraped and subscribed to once, whatever N is.

Worker 0 scrapes every pod's /metrics and subscribes to every KV-event publisher as a lone EPP does, and hands
each scrape's outcome (the page, or why it failed) and each KV-event message as it arrives to a ZMQ PUB bound on
`ipc://` in the parent's private directory (`FeedPublisher`). The other workers make no scrape and open no pod
socket: their scraper and subscriptions are `fed` from a SUB on that socket (`FeedConsumer`), which applies what
comes as if they had scraped or received it themselves: their own parse, health, shard workers and index (the
index is per worker: N copies). A worker started or restarted gets each pod's page at worker 0's next scrape (one
interval) and replays the KV events it missed from the pods' replay sockets; a gap in the feed (a message dropped
for a worker that fell behind the PUB's high-water mark) is a sequence gap like any other and replayed the same way.

Worker 0 gone (restarting): the others say so (`pyepp_worker_feed_connected` 0, a warning) and keep routing on
their last metrics and index (the metrics go stale as a pod's would, and health fails open once all are), and
catch up when it is back. Frames: `[b"m", name, status, why, page]`, `[b"k", pod, replay, *frames]`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import zmq
import zmq.asyncio
from prometheus_client import Counter, Gauge

from epp.datalayer.scraper import MetricsScraper
from epp.framework.logthrottle import LogThrottle
from epp.kvcache.subscriptions import Subscriptions, drain_socket
from epp.wiring.runtime import Runtime
from epp.wiring.services import EppServices

log = logging.getLogger(__name__)
_throttle = LogThrottle()

METRICS = b"m"
EVENTS = b"k"
# Messages queued for one worker that does not read; beyond, ZMQ's PUB drops its messages, silently and for it
# alone (a KV batch dropped is a sequence gap its replay fills; a page, the next scrape's).
SNDHWM = 16_384

PUBLISHED = Counter(
    "pyepp_worker_feed_published",
    "Scrapes (kind=metrics) and KV-event messages (kind=kv_events) worker 0 handed to the workers' feed",
    ["kind"],
)
RECEIVED = Counter(
    "pyepp_worker_feed_received",
    "Scrapes (kind=metrics) and KV-event messages (kind=kv_events) this worker took from the workers' feed, by "
    "outcome (applied; unknown_endpoint: not an endpoint this worker follows; bad: malformed)",
    ["kind", "outcome"],
)
CONNECTED = Gauge("pyepp_worker_feed_connected", "1 while this worker is connected to the workers' feed (worker 0)")
for _kind in ("metrics", "kv_events"):
    PUBLISHED.labels(_kind)
    for _outcome in ("applied", "unknown_endpoint"):
        RECEIVED.labels(_kind, _outcome)


def event_subscriptions(runtime: Runtime) -> Subscriptions | None:
    services = runtime.context.services if runtime.context is not None else None
    kv = services.kv if isinstance(services, EppServices) else None
    return kv.pool.subscriptions if kv is not None and kv.settings.events_enabled else None


def attach_feed(runtime: Runtime, address: str, *, publish: bool) -> None:
    """Worker 0 (`publish`): its scraper and KV subscriptions also publish on `address`. Any other worker: they are
    fed from `address` instead of scraping and subscribing. Before the runtime starts."""
    scraper, subscriptions = runtime.scraper, event_subscriptions(runtime)
    if publish:
        pub = FeedPublisher(address)
        if scraper is not None:
            scraper.tap = pub.scrape
        if subscriptions is not None:
            subscriptions.tap = pub.frames
        runtime.background.insert(0, pub.run)
        return
    if scraper is not None:
        scraper.fed = True
    if subscriptions is not None:
        subscriptions.fed = True
    runtime.background.insert(0, FeedConsumer(address, scraper, subscriptions).run)


class FeedPublisher:
    def __init__(self, address: str) -> None:
        self.address = address
        self._sock: zmq.Socket[bytes] | None = None
        self._sent = {k: PUBLISHED.labels(k) for k in ("metrics", "kv_events")}

    def start(self) -> None:
        sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.PUB)  # a PUB never blocks: a plain socket
        sock.setsockopt(zmq.SNDHWM, SNDHWM)
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(self.address)
        self._sock = sock

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None

    async def run(self) -> None:
        """Bound while the EPP runs (a runtime background coroutine)."""
        self.start()
        log.info("workers' feed: publishing scrapes and KV events on %s", self.address)
        try:
            await asyncio.Event().wait()
        finally:
            self.close()

    def _send(self, kind: str, parts: list[bytes]) -> None:
        if self._sock is None:
            return
        try:
            self._sock.send_multipart(parts, flags=zmq.NOBLOCK, copy=False)  # (a PUB drops rather than refuse)
        except zmq.ZMQError as e:  # never into the scraper's or the subscriptions' loops
            _throttle.log(log, logging.WARNING, "send", "workers' feed: a %s message was not sent: %s", kind, e)
            return
        self._sent[kind].inc()

    def scrape(self, name: str, status: int, body: bytes, why: str) -> None:
        """The scraper's tap (`ScrapeTap`)."""
        self._send("metrics", [METRICS, name.encode(), str(status).encode(), why.encode(), body])

    def frames(self, pod: str, replay: str, frames: list[bytes]) -> None:
        """The KV subscriptions' tap (`FrameTap`)."""
        self._send("kv_events", [EVENTS, pod.encode(), replay.encode(), *frames])


class FeedConsumer:
    def __init__(self, address: str, scraper: MetricsScraper | None, subscriptions: Subscriptions | None) -> None:
        self.address = address
        self.scraper = scraper
        self.subscriptions = subscriptions
        self.connected = False
        self._applied = {k: RECEIVED.labels(k, "applied") for k in ("metrics", "kv_events")}
        self._unknown = {k: RECEIVED.labels(k, "unknown_endpoint") for k in ("metrics", "kv_events")}

    async def run(self) -> None:
        """Take the feed until cancelled (a runtime background coroutine)."""
        ctx = zmq.asyncio.Context.instance()
        sock = ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, SNDHWM)
        sock.setsockopt(zmq.RECONNECT_IVL, 100)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        mon = sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)  # before connect
        monitor = asyncio.create_task(self._monitor(mon))
        CONNECTED.set(0)
        try:
            sock.connect(self.address)
            log.info("workers' feed: taking scrapes and KV events from worker 0 at %s", self.address)
            await self._recv_loop(sock)
        finally:
            monitor.cancel()
            with contextlib.suppress(BaseException):
                await monitor
            with contextlib.suppress(zmq.ZMQError):
                sock.disable_monitor()
            mon.close(linger=0)
            sock.close(linger=0)

    async def _monitor(self, mon: zmq.asyncio.Socket) -> None:
        from zmq.utils.monitor import parse_monitor_message

        lost = False
        while True:
            event = parse_monitor_message(await mon.recv_multipart())["event"]
            if event == zmq.EVENT_CONNECTED:
                self.connected = True
                CONNECTED.set(1)
                if lost:
                    log.warning("workers' feed: worker 0 is back at %s", self.address)
                if self.subscriptions is not None:
                    await asyncio.sleep(0.05)  # let the subscription reach the PUB before the replays start
                    self.subscriptions.fed_connected()
            elif event == zmq.EVENT_DISCONNECTED:
                self.connected, lost = False, True
                CONNECTED.set(0)
                if self.subscriptions is not None:
                    self.subscriptions.fed_disconnected()
                log.warning(
                    "workers' feed: worker 0 (%s) is gone; routing on this worker's last metrics and KV index until "
                    "it is back", self.address,
                )  # fmt: skip

    async def _recv_loop(self, sock: zmq.asyncio.Socket) -> None:
        """Drain the socket at each wake-up of its FD without blocking, as the KV subscriptions do."""

        def handle(parts: list[bytes]) -> None:
            try:
                self.apply(parts)
            except Exception:  # one bad message must not stop the feed
                RECEIVED.labels("?", "bad").inc()
                log.exception("workers' feed: a message could not be applied")

        await drain_socket(sock, handle)

    def apply(self, parts: list[bytes]) -> None:
        kind = parts[0] if parts else b""
        if kind == METRICS and len(parts) == 5:
            if self.scraper is None:
                return
            name, status, why, body = parts[1].decode(), int(parts[2]), parts[3].decode(), parts[4]
            ok = self.scraper.receive(name, status, body, why)
            (self._applied if ok else self._unknown)["metrics"].inc()
        elif kind == EVENTS and len(parts) >= 3:
            if self.subscriptions is None:
                return
            known = self.subscriptions.receive(parts[1].decode(), parts[2].decode(), parts[3:])
            # (applied: handed to the shards, which count what they refuse in their own metrics)
            (self._applied if known else self._unknown)["kv_events"].inc()
        else:
            RECEIVED.labels(kind.decode(errors="replace")[:8] or "?", "bad").inc()
