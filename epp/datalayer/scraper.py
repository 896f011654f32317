"""The metrics scrape loop: every endpoint the Datastore holds is scraped every `interval` (start on add, stop on
remove), all of them from one timer.

GIE's --refresh-metrics-interval is 50 ms, so with a handful of pods this runs ~80 times a second on the event loop
that also serves ext_proc. Each GET goes over the endpoint's own kept-alive connection (`httpget.KeepAliveGet`) and
is driven by callbacks: one timer tick starts the GETs of every endpoint that is due, each response is handled in
the connection's `data_received` (status, parse, health), and the deadlines are checked at the ticks. No task,
future, timeout handle or sleep per scrape; a task only when a connection has to be (re)opened. A page whose bytes
did not change since the last scrape is not parsed again (a copy of the Metrics it gave, with a fresh update time).

Each scrape swaps a fresh Metrics object into the Endpoint (a single attribute store, so the scheduler never sees a
half-updated one). A failed scrape keeps the old Metrics, which then goes stale; staleness is judged by readers
(the utilization detector treats stale as saturated). Every outcome also goes to `epp.datalayer.health`, which
takes dead and hung endpoints out of the candidates. The ticks keep to a grid (`interval` apart), so the pods'
scrapes share one wake-up: a scrape is due `interval` (or its failure backoff) after the tick it started on, and at
once when its GET took longer than that.

`epp serve --workers N` scrapes each pod once whatever N is: worker 0's scraper hands every outcome to `tap` (the
workers' feed, epp.wiring.feed), and the other workers' scrapers are `fed`: they make no GET and apply the outcomes
the feed brings (`receive`) as if they had scraped, page, parse, health and all.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import math
import ssl
import time
from collections.abc import Callable
from typing import Any

from epp.datalayer import health
from epp.datalayer.extractor import CoreMetricsExtractor, EngineConfig
from epp.datalayer.httpget import HTTPGetError, KeepAliveGet
from epp.framework import Endpoint, EndpointView, Metrics
from epp.framework.verbosity import DEFAULT, V

log = logging.getLogger(__name__)

_EARLY = 1e-6  # in ticks: float slack when comparing loop times with the grid

# A scrape's outcome as the workers' feed carries it: (endpoint name, HTTP status or 0, page, why it failed or "").
ScrapeTap = Callable[[str, int, bytes, str], None]


class FedScrapeError(Exception):
    """A scrape that failed in the worker that made it (its reason, as that worker saw it)."""


class _Target:
    """One endpoint's scrape state; the sink of its GETs' responses (`httpget.ResponseSink`)."""

    __slots__ = (
        "backoff", "busy", "client", "deadline", "due", "endpoint", "engine", "healthy", "metrics", "page",
        "scraper", "stopped", "task", "tick", "url",
    )  # fmt: skip

    def __init__(self, scraper: MetricsScraper, endpoint: Endpoint, client: KeepAliveGet, now: float) -> None:
        self.scraper = scraper
        self.endpoint = endpoint
        self.url = scraper.url(endpoint)
        self.client = client
        self.due = now  # loop time of the next scrape
        self.tick = 0  # the grid tick of the last one
        self.deadline = math.inf  # of the GET in flight
        self.backoff = scraper.interval
        self.healthy = True
        self.busy = False  # a GET in flight
        self.task: asyncio.Task[None] | None = None  # the GET that (re)connects
        self.stopped = False
        # The last page parsed and what it gave (reused while the page is byte for byte the same).
        self.page = b""
        self.metrics: Metrics | None = None
        self.engine: EngineConfig | None = None

    # ResponseSink (called from the connection's protocol callbacks)
    def done(self) -> bool:
        return not self.busy

    def set_result(self, result: tuple[int, bytes], /) -> None:
        self.scraper._finish(self, result[0], result[1], None)

    def set_exception(self, exception: BaseException, /) -> None:
        self.scraper._finish(self, 0, b"", exception)


class MetricsScraper:
    def __init__(
        self,
        view: EndpointView,
        *,
        interval: float = 0.05,
        timeout: float = 1.0,
        scheme: str = "http",
        path: str = "/metrics",
        insecure_skip_verify: bool = True,
        extractor: CoreMetricsExtractor | None = None,
        max_backoff: float = 1.0,
    ) -> None:
        self.view = view
        self.max_backoff = max_backoff
        self.interval = interval
        self.timeout = timeout
        self.scheme = scheme
        self.path = path if path.startswith("/") else "/" + path
        self.insecure_skip_verify = insecure_skip_verify
        self.extractor = extractor or CoreMetricsExtractor()
        self._targets: dict[str, _Target] = {}
        self._pending: dict[str, Endpoint] = {}
        self._running = False
        self._ssl: ssl.SSLContext | None = None
        self._subscribed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self._grid = 0.0  # loop time of tick 0: ticks are at _grid + k * interval
        self.scrapes = 0
        self.failures = 0
        self.reparses_skipped = 0
        self.tap: ScrapeTap | None = None  # told every outcome (worker 0 of `--workers`: the feed)
        self.fed = False  # no GETs: the outcomes come through `receive` (the other workers of `--workers`)
        self.received = 0

    def url(self, endpoint: Endpoint) -> str:
        return f"{self.scheme}://{endpoint.metrics_hostport}{self.path}"

    # EndpointListener
    def endpoint_added(self, endpoint: Endpoint) -> None:
        if not self._running:
            self._pending[endpoint.name] = endpoint
            return
        self._start(endpoint)

    def endpoint_updated(self, endpoint: Endpoint) -> None:
        """Labels and attributes do not change where the metrics are (that is a remove + add): keep scraping."""

    def endpoint_removed(self, endpoint: Endpoint) -> None:
        self._pending.pop(endpoint.name, None)
        t = self._targets.get(endpoint.name)
        if t is not None and t.endpoint is endpoint:
            del self._targets[endpoint.name]
            self._stop(t)

    def running(self) -> list[str]:
        return sorted(self._targets)

    def _start(self, endpoint: Endpoint) -> None:
        old = self._targets.pop(endpoint.name, None)
        if old is not None:
            self._stop(old)
        assert self._loop is not None
        t = _Target(self, endpoint, self._client(endpoint), self._loop.time())
        self._targets[endpoint.name] = t
        if not self.fed:
            self._begin(t, t.due)  # the first scrape at once; then on the ticks

    def _stop(self, t: _Target) -> None:
        t.stopped = True
        t.busy = False
        if t.task is not None:
            t.task.cancel()
            t.task = None
        t.client.abort()

    def _ssl_context(self) -> ssl.SSLContext | None:
        if self.scheme != "https":
            return None
        ctx = ssl.create_default_context()
        if self.insecure_skip_verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        return ctx

    def _client(self, endpoint: Endpoint) -> KeepAliveGet:
        host = endpoint.metrics_address or endpoint.address
        return KeepAliveGet(host, endpoint.metrics_port or endpoint.port, self.path, ssl_context=self._ssl)

    async def run(self) -> None:
        """Scrape until cancelled (a Runtime background coroutine)."""
        self._ssl = self._ssl_context()  # scheme/path/verification may be set after construction (CLI flags)
        self._loop = asyncio.get_running_loop()
        self._grid = self._loop.time()
        self._running = True
        try:
            if not self._subscribed:
                self._subscribed = True
                self.view.subscribe(self)
            for ep in list(self._pending.values()):
                self._start(ep)
            self._pending.clear()
            await asyncio.Event().wait()
        finally:
            self._running = False
            if self._timer is not None:
                self._timer.cancel()
                self._timer, self._timer_at = None, math.inf
            tasks = [t.task for t in self._targets.values() if t.task is not None]
            for t in self._targets.values():
                self._stop(t)
                self._pending[t.endpoint.name] = t.endpoint
            self._targets.clear()
            await asyncio.gather(*tasks, return_exceptions=True)

    # -- the tick --------------------------------------------------------------------------------------------

    def _tick(self) -> None:
        self._timer, self._timer_at = None, math.inf
        assert self._loop is not None
        now = self._loop.time()
        when = math.inf
        for t in list(self._targets.values()):
            try:
                if t.busy:
                    if now >= t.deadline:  # (a reconnecting GET has its own timeout: deadline inf)
                        t.client.abort()
                        self._finish(t, 0, b"", TimeoutError(f"no answer within {self.timeout:g} s"), now)
                elif now >= t.due - _EARLY:
                    self._begin(t, now)
            except Exception as e:  # one endpoint's failure must not stop the ticks for all
                log.exception("endpoint %s: starting a scrape failed", t.endpoint.name)
                t.client.abort()
                self._finish(t, 0, b"", e, now)
            w = t.deadline if t.busy else t.due
            if w < when:
                when = w
        if when < math.inf:
            # GETs in flight are due again at the next grid tick once answered: arm that now rather than their
            # deadline (re-armed by the first answer).
            nxt = self._grid + (math.floor((now - self._grid) / self.interval + _EARLY) + 1) * self.interval
            self._arm(max(min(when, nxt), now))

    def _arm(self, when: float) -> None:
        """The one timer, at `when` unless it already fires earlier."""
        if not self._running or self.fed:
            return
        if self._timer is not None:
            if self._timer_at <= when:
                return
            self._timer.cancel()
        assert self._loop is not None
        self._timer_at = when
        self._timer = self._loop.call_at(when, self._tick)

    def _begin(self, t: _Target, now: float) -> None:
        self.scrapes += 1
        t.busy = True
        # The tick this scrape belongs to (a tick runs a little late; a first scrape can fall between two).
        t.tick = math.floor((now - self._grid) / self.interval + _EARLY)
        t.due = math.inf
        if t.client.send(t):
            t.deadline = now + self.timeout
        else:  # no open connection: connect and GET in a task, with its own timeout
            assert self._loop is not None
            t.deadline = math.inf
            t.task = self._loop.create_task(self._reconnect(t), name=f"scrape {t.endpoint.name}")

    async def _reconnect(self, t: _Target) -> None:
        try:
            status, body = await t.client.get(self.timeout)
        except Exception as e:  # HTTPGetError, TimeoutError, OSError; anything else fails this scrape alone too
            t.task = None
            self._finish(t, 0, b"", e)
        else:
            t.task = None
            self._finish(t, status, body, None)

    def _finish(self, t: _Target, status: int, body: bytes, error: BaseException | None, now: float = 0.0) -> None:
        """One GET's outcome: the endpoint's Metrics, its health, the next due time."""
        if t.stopped or not t.busy:
            return
        t.busy = False
        t.deadline = math.inf
        ok = False
        try:
            if error is not None:
                self.failures += 1
                why = f"{type(error).__name__}: {error}"
            else:
                ok, why = self._apply(t, status, body)
            self._outcome(t, ok, why)
            if self.tap is not None:
                self.tap(t.endpoint.name, status, body, "" if ok or error is None else why)
        except Exception:  # never into the connection's callbacks
            log.exception("endpoint %s: scrape bookkeeping failed", t.endpoint.name)
        # Failing endpoints are retried with exponential backoff (capped): their metrics are stale either way. The
        # next scrape is `backoff` after this one's tick, on the grid (at once if that has passed).
        t.backoff = self.interval if ok else min(t.backoff * 2, max(self.interval, self.max_backoff))
        t.due = self._grid + (t.tick + math.ceil(t.backoff / self.interval - _EARLY)) * self.interval
        if self._timer is None or self._timer_at > t.due:
            assert self._loop is not None
            self._arm(max(t.due, now or self._loop.time()))

    def _apply(self, t: _Target, status: int, body: bytes) -> tuple[bool, str]:
        if status != 200:
            self.failures += 1
            return False, f"HTTP {status}"
        ep = t.endpoint
        engine = self.extractor.engine_for(ep)
        prev = t.metrics
        if prev is not None and ep.metrics is prev and body == t.page and engine is t.engine:
            m = copy.copy(prev)  # the same page gives the same Metrics: only the time moves
            m.update_time = time.monotonic()
            self.reparses_skipped += 1
        else:
            parsed, why = self._parse(body, ep)
            if parsed is None:
                t.metrics = None
                return False, why
            m = parsed
            t.page, t.engine = body, engine
        ep.metrics = t.metrics = m
        return True, ""

    def _parse(self, body: bytes, endpoint: Endpoint) -> tuple[Metrics | None, str]:
        """The page's Metrics, or None and why (a malformed page must not stop the scrapes)."""
        try:
            return self.extractor.extract(body.decode("utf-8", "replace"), endpoint), ""
        except Exception as e:
            self.failures += 1
            return None, f"cannot parse metrics: {e}"

    def _outcome(self, t: _Target, ok: bool, why: str) -> None:
        ep = t.endpoint
        if ok:
            health.scrape_ok(ep, time.monotonic())
        else:
            health.scrape_failed(ep)
        if ok != t.healthy:
            t.healthy = ok
            if ok:
                log.log(V(DEFAULT), "endpoint %s: metrics scrape recovered", ep.name)
            else:
                log.warning("endpoint %s: metrics scrape of %s failed: %s", ep.name, t.url, why)

    def receive(self, name: str, status: int, body: bytes, why: str = "") -> bool:
        """A scrape of endpoint `name` made by another worker (`why`: it failed there), applied as if this scraper
        had made it. False when this scraper does not follow `name` (not discovered here yet, or gone)."""
        t = self._targets.get(name)
        if t is None or not self._running:
            return False
        self.received += 1
        t.busy = True
        self._finish(t, status, body, FedScrapeError(why) if why else None)
        return True

    async def scrape_once(self, endpoint: Endpoint, client: KeepAliveGet | None = None) -> tuple[bool, str]:
        """One scrape outside the ticks (over `client`'s kept-alive connection, else a fresh one); on success the
        endpoint's Metrics object is replaced. Returns (ok, reason)."""
        if not self._running:
            return False, "scraper not running"
        self.scrapes += 1
        own = client is None
        c = client or self._client(endpoint)
        try:
            status, body = await c.get(self.timeout)
        except (HTTPGetError, TimeoutError, OSError) as e:
            self.failures += 1
            return False, f"{type(e).__name__}: {e}"
        finally:
            if own:
                c.close()
        if status != 200:
            self.failures += 1
            return False, f"HTTP {status}"
        m, why = self._parse(body, endpoint)
        if m is None:
            return False, why
        endpoint.metrics = m
        return True, ""

    def stats(self) -> dict[str, Any]:
        return {
            "endpoints": len(self._targets),
            "scrapes": self.scrapes,
            "failures": self.failures,
            "reparses_skipped": self.reparses_skipped,
            "received": self.received,
        }
