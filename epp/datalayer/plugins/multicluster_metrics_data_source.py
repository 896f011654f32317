"""multicluster-metrics-data-source (llm-d-router, Alpha): a multi-cluster hub scrapes each cluster's EPP /metrics
(at the cluster's `metricsAddress:metricsPort` labels, else its address and port) and feeds the page to
multicluster-metrics-extractor.

As llm-d-router's: `scheme` https by default with the peer's certificate verified (a cross-cluster scrape crosses a
trust boundary), `caCertPath` for a private CA, `clientCertPath`/`clientKeyPath` for mutual TLS,
`insecureSkipVerify`, `path` (/metrics), `port` (overrides every cluster's), and a page is read up to 8 MiB. `interval`
defaults to 1 s here, not every 50 ms tick: the pool gauges it reads change every 5 s
(`--refresh-prometheus-metrics-interval`).
"""

from __future__ import annotations

import logging
import ssl
from typing import Self

import aiohttp

from epp.datalayer.plugins._polling_source import PollingSource
from epp.framework import Params, PluginContext, Stability

log = logging.getLogger(__name__)

MAX_RESPONSE_BYTES = 8 << 20


class MultiClusterMetricsDataSource(PollingSource):
    type_name = "multicluster-metrics-data-source"
    stability = Stability.ALPHA
    extractor_types = ("multicluster-metrics-extractor",)
    max_bytes = MAX_RESPONSE_BYTES

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        scheme = params.str("scheme", "https", choices=("http", "https"))
        ca, cert, key = params.str("caCertPath", ""), params.str("clientCertPath", ""), params.str("clientKeyPath", "")
        if bool(cert) != bool(key):
            raise params.fail(
                "clientCertPath" if key else "clientKeyPath", "clientCertPath and clientKeyPath go together"
            )
        port = params.int("port", 0, min=0, max=65535)
        src = cls(
            name,
            context.endpoints,
            scheme=scheme,
            path=params.str("path", "/metrics") or "/metrics",
            port=port or None,
            insecure=params.bool("insecureSkipVerify", False),
            interval=params.duration("interval", 1.0) or 1.0,
        )
        src.ssl_context = cls.tls(scheme, src.insecure, ca, cert, key, params)
        src.start(context)
        return src

    ssl_context: ssl.SSLContext | bool = False

    @staticmethod
    def tls(scheme: str, insecure: bool, ca: str, cert: str, key: str, params: Params) -> ssl.SSLContext | bool:
        """The client TLS the scrapes use (plain http: none); a CA or client pair that cannot be loaded fails the
        config, as llm-d-router's factory does."""
        if scheme != "https":
            return False
        ctx = ssl.create_default_context()
        try:
            if ca:
                ctx.load_verify_locations(cafile=ca)
            if cert:
                ctx.load_cert_chain(cert, key)
        except (OSError, ssl.SSLError) as e:
            raise params.fail("caCertPath" if ca and not cert else "clientCertPath", f"cannot load: {e}") from None
        if insecure:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        return ctx

    def connector(self) -> aiohttp.TCPConnector:
        return aiohttp.TCPConnector(ssl=self.ssl_context)

    async def read(self, resp: aiohttp.ClientResponse) -> str:
        """At most 8 MiB of a peer's page: a hostile or broken peer cannot exhaust the hub's memory."""
        body = bytearray()
        while len(body) < self.max_bytes:
            chunk = await resp.content.read(self.max_bytes - len(body))
            if not chunk:
                break
            body += chunk
        return body.decode("utf-8", errors="replace")
