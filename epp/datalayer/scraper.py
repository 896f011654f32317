"""One scrape loop per endpoint, following the Datastore (start on add, stop on remove).

Each loop GETs the endpoint's metrics page every `interval` (GIE: --refresh-metrics-interval, 50 ms) over its own
kept-alive connection (`httpget.KeepAliveGet`: these GETs share the event loop with ext_proc, and aiohttp cost a
few times more CPU per scrape), and swaps a fresh Metrics object into the Endpoint (a single attribute store, so the
scheduler never sees a half-updated one). A failed scrape keeps the old Metrics, which then goes stale;
staleness is judged by readers (the utilization detector treats stale as saturated). Every outcome also goes to
`epp.datalayer.health`, which takes dead and hung endpoints out of the candidates.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from typing import Any

from epp.datalayer import health
from epp.datalayer.extractor import CoreMetricsExtractor
from epp.datalayer.httpget import HTTPGetError, KeepAliveGet
from epp.framework import Endpoint, EndpointView

log = logging.getLogger(__name__)


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
        self._tasks: dict[str, tuple[Endpoint, asyncio.Task[None]]] = {}
        self._pending: dict[str, Endpoint] = {}
        self._running = False
        self._ssl: ssl.SSLContext | None = None
        self._subscribed = False
        self.scrapes = 0
        self.failures = 0

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
        entry = self._tasks.get(endpoint.name)
        if entry is not None and entry[0] is endpoint:
            del self._tasks[endpoint.name]
            entry[1].cancel()

    def running(self) -> list[str]:
        return sorted(self._tasks)

    def _start(self, endpoint: Endpoint) -> None:
        old = self._tasks.pop(endpoint.name, None)
        if old is not None:
            old[1].cancel()
        task = asyncio.get_running_loop().create_task(self._loop(endpoint), name=f"scrape {endpoint.name}")
        self._tasks[endpoint.name] = (endpoint, task)

    def _ssl_context(self) -> ssl.SSLContext | None:
        if self.scheme != "https":
            return None
        ctx = ssl.create_default_context()
        if self.insecure_skip_verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        return ctx

    def _client(self, endpoint: Endpoint) -> KeepAliveGet:
        return KeepAliveGet(endpoint.address, endpoint.metrics_port or endpoint.port, self.path, ssl_context=self._ssl)

    async def run(self) -> None:
        """Scrape until cancelled (a Runtime background coroutine)."""
        self._ssl = self._ssl_context()  # scheme/path/verification may be set after construction (CLI flags)
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
            tasks = [t for _, t in self._tasks.values()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for ep, _ in self._tasks.values():
                self._pending[ep.name] = ep
            self._tasks.clear()
            self._running = False

    async def _loop(self, endpoint: Endpoint) -> None:
        url = self.url(endpoint)
        client = self._client(endpoint)
        try:
            await self._scrape_forever(endpoint, url, client)
        finally:
            client.close()

    async def _scrape_forever(self, endpoint: Endpoint, url: str, client: KeepAliveGet) -> None:
        healthy = True
        backoff = self.interval
        while True:
            t0 = time.monotonic()
            ok, why = await self.scrape_once(endpoint, client)
            if ok:
                health.scrape_ok(endpoint, time.monotonic())
            else:
                health.scrape_failed(endpoint)
            if ok != healthy:
                healthy = ok
                if ok:
                    log.info("endpoint %s: metrics scrape recovered", endpoint.name)
                else:
                    log.warning("endpoint %s: metrics scrape of %s failed: %s", endpoint.name, url, why)
            # Failing endpoints are retried with exponential backoff (capped): their metrics are stale either way.
            backoff = self.interval if ok else min(backoff * 2, max(self.interval, self.max_backoff))
            delay = backoff - (time.monotonic() - t0)
            await asyncio.sleep(delay if delay > 0 else 0)

    async def scrape_once(self, endpoint: Endpoint, client: KeepAliveGet | None = None) -> tuple[bool, str]:
        """One scrape (over `client`'s kept-alive connection, else a fresh one); on success the endpoint's Metrics
        object is replaced. Returns (ok, reason)."""
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
        try:
            endpoint.metrics = self.extractor.extract(body.decode("utf-8", "replace"), endpoint)
        except Exception as e:  # a malformed page must not kill the loop
            self.failures += 1
            return False, f"cannot parse metrics: {e}"
        return True, ""

    def stats(self) -> dict[str, Any]:
        return {"endpoints": len(self._tasks), "scrapes": self.scrapes, "failures": self.failures}
