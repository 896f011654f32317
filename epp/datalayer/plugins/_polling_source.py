"""A data source that polls one HTTP page per endpoint and hands it to the extractors wired to it in
`dataLayer.sources` (dcgm-data-source, models-data-source): one loop for all endpoints, every `interval`, each
GET bounded by a timeout, all in the background (never on the request path)."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import aiohttp

from epp.framework import Endpoint, EndpointView, Params, Plugin, PluginContext

log = logging.getLogger(__name__)


@runtime_checkable
class PageExtractor(Protocol):
    """An extractor a polling source feeds: `extract(endpoint, page text)` writes endpoint attributes."""

    name: str

    def extract(self, endpoint: Endpoint, text: str) -> None: ...

    def forget(self, endpoint: Endpoint) -> None: ...


class PollingSource(Plugin):
    extractor_types: tuple[str, ...] = ()

    def __init__(
        self,
        name: str,
        view: EndpointView,
        *,
        scheme: str = "http",
        path: str = "/metrics",
        port: int | None = None,
        insecure: bool = True,
        interval: float = 1.0,
        timeout: float = 2.0,
        node_address: bool = False,
    ) -> None:
        super().__init__(name)
        self.view = view
        self.scheme, self.path, self.port = scheme, path if path.startswith("/") else "/" + path, port
        self.insecure, self.interval, self.timeout, self.node_address = insecure, interval, timeout, node_address
        self.extractors: list[PageExtractor] = []
        self.polls = 0
        self.failures = 0
        self._failing: set[str] = set()  # endpoints whose last poll failed (a warning on the way in, info out)

    @staticmethod
    def common(params: Params, default_path: str) -> dict[str, Any]:
        return {
            "scheme": params.str("scheme", "http", choices=("http", "https")),
            "path": params.str("path", default_path) or default_path,
            "insecure": params.bool("insecureSkipVerify", True),
            "interval": params.duration("interval", 1.0) or 1.0,
        }

    def attach_extractors(self, extractors: Sequence[Plugin]) -> None:
        """The extractors `dataLayer.sources` wires to this source (the wiring checks their kind)."""
        for ex in extractors:
            if not isinstance(ex, PageExtractor) or (self.extractor_types and ex.type_name not in self.extractor_types):
                raise ValueError(f"{ex.name} ({ex.type_name}) cannot extract from {self.type_name} {self.name}")
            self.extractors.append(ex)

    def start(self, context: PluginContext) -> None:
        context.run_in_background(self.run)

    def url(self, ep: Endpoint) -> str | None:
        host = ep.node_address if self.node_address else (ep.metrics_address or ep.address)
        if not host:
            return None
        port = self.port or ep.metrics_port or ep.port
        host = f"[{host}]" if ":" in host else host
        return f"{self.scheme}://{host}:{port}{self.path}"

    async def poll_once(self, session: aiohttp.ClientSession) -> None:
        eps = list(self.view.endpoints())
        await asyncio.gather(*(self._poll(session, ep) for ep in eps))

    async def _poll(self, session: aiohttp.ClientSession, ep: Endpoint) -> None:
        url = self.url(ep)
        if url is None:
            return
        self.polls += 1
        try:
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=self.timeout)) as resp:
                if resp.status != 200:
                    raise aiohttp.ClientError(f"HTTP {resp.status}")
                text = await self.read(resp)
        except (aiohttp.ClientError, TimeoutError, UnicodeDecodeError) as e:
            self.failures += 1
            if ep.name not in self._failing:
                self._failing.add(ep.name)
                log.warning(
                    "%s: polling %s failed: %s (said once until it answers again)", self.name, url, e or "timeout"
                )
            else:
                log.debug("%s: polling %s failed: %s", self.name, url, e)
            return
        if ep.name in self._failing:
            self._failing.discard(ep.name)
            log.info("%s: polling %s answers again", self.name, url)
        for ex in self.extractors:
            try:
                ex.extract(ep, text)
            except Exception:
                log.exception("%s: extractor %s failed for %s", self.name, ex.name, ep.name)

    def connector(self) -> aiohttp.TCPConnector:
        ssl_ctx: ssl.SSLContext | bool = False if self.insecure else ssl.create_default_context()
        return aiohttp.TCPConnector(ssl=ssl_ctx)

    async def read(self, resp: aiohttp.ClientResponse) -> str:
        """The page's text (a source may bound it)."""
        return await resp.text()

    async def run(self) -> None:
        if not self.extractors:
            log.info("%s: no extractor wired in dataLayer.sources: not polling", self.name)
            return
        async with aiohttp.ClientSession(connector=self.connector()) as session:
            while True:
                await self.poll_once(session)
                await asyncio.sleep(self.interval)
