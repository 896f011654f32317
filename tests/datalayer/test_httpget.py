"""The scraper's keep-alive GET: framing (Content-Length, chunked, read-to-EOF), connection reuse, bad responses,
TLS, and the scraper over it against aiohttp's server."""

from __future__ import annotations

import asyncio
import ssl
import subprocess
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from aiohttp import web

from e2e.harness.aioserve import serve_app
from epp.datalayer.datastore import Datastore
from epp.datalayer.httpget import HTTPGetError, KeepAliveGet
from epp.datalayer.scraper import MetricsScraper
from epp.framework import Endpoint

PAGE = 'vllm:num_requests_waiting{model_name="m"} 3.0\nvllm:num_requests_running{model_name="m"} 2.0\n'


class RawServer:
    """Answers each request (one per `\\r\\n\\r\\n`) with the next canned reply; counts connections."""

    def __init__(self, replies: Callable[[int], bytes | None]) -> None:
        self.replies = replies
        self.requests: list[bytes] = []
        self.connections = 0
        self.server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._conn, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _conn(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                req = await r.readuntil(b"\r\n\r\n")
                self.requests.append(req)
                reply = self.replies(len(self.requests) - 1)
                if reply is None:  # hang
                    await asyncio.sleep(10)
                    return
                w.write(reply)
                await w.drain()
                if b"Connection: close" in reply or (b"Content-Length" not in reply and b"chunked" not in reply):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            w.close()

    async def close(self) -> None:
        assert self.server is not None
        self.server.close()


@pytest.fixture
async def raw() -> AsyncIterator[Callable[[Callable[[int], bytes | None]], RawServer]]:
    servers: list[RawServer] = []

    def make(replies: Callable[[int], bytes | None]) -> RawServer:
        s = RawServer(replies)
        servers.append(s)
        return s

    yield make
    for s in servers:
        await s.close()


def ok(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n" + extra + b"Content-Length: %d\r\n\r\n" % len(body) + body


async def test_content_length_keeps_the_connection(raw: Callable[..., RawServer]) -> None:
    s = raw(lambda i: ok(b"page %d" % i))
    await s.start()
    c = KeepAliveGet("127.0.0.1", s.port, "/metrics")
    assert [await c.get(10.0) for _ in range(3)] == [(200, b"page 0"), (200, b"page 1"), (200, b"page 2")]
    assert s.connections == 1 and c.connects == 1
    assert s.requests[0].startswith(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n" % s.port)
    c.close()


async def test_chunked_with_extensions_and_trailers(raw: Callable[..., RawServer]) -> None:
    reply = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5;ext=1\r\nhello\r\n1\r\n \r\n5\r\nworld\r\n0\r\nX-Trailer: y\r\n\r\n"
    )
    s = raw(lambda i: reply)
    await s.start()
    c = KeepAliveGet("127.0.0.1", s.port, "/m")
    assert await c.get(10.0) == (200, b"hello world")
    assert await c.get(10.0) == (200, b"hello world")
    assert s.connections == 1
    c.close()


async def test_close_delimited_and_connection_close_reconnect(raw: Callable[..., RawServer]) -> None:
    replies = [
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nread to the end",  # no length: ends at EOF
        ok(b"closing", b"Connection: close\r\n"),
        b"HTTP/1.0 503 Service Unavailable\r\nContent-Length: 4\r\n\r\nbusy",  # 1.0: not kept alive
        ok(b"again"),
    ]
    s = raw(lambda i: replies[i])
    await s.start()
    c = KeepAliveGet("127.0.0.1", s.port, "/m")
    got = [await c.get(10.0) for _ in range(4)]
    assert got == [(200, b"read to the end"), (200, b"closing"), (503, b"busy"), (200, b"again")]
    assert s.connections == 4
    c.close()


@pytest.mark.parametrize(
    "reply, error",
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n", "bad Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: +1\r\n\r\na", "bad Content-Length"),  # int() would take these
        (b"HTTP/1.1 200 OK\r\nContent-Length: 0_1\r\n\r\na", "bad Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 1, 1\r\n\r\na", "bad Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2000\r\n\r\nabc", "response over 1024 bytes"),  # told at once
        (b"HTTP/1.1 200 OK\r\nContent-Length: " + b"9" * 5000 + b"\r\n\r\na", "response over 1024 bytes"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-1\r\nab\r\n0\r\n\r\n", "bad chunk size"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0x2\r\nab\r\n0\r\n\r\n", "bad chunk size"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"f" * 17 + b"\r\n", "bad chunk size"),
        (b"SPDY/3 200 OK\r\nContent-Length: 1\r\n\r\na", "bad status line"),
        (b"HTTP/1.1 " + b"2" * 5000 + b" OK\r\nContent-Length: 1\r\n\r\na", "bad status line"),  # 3 digits
        (b"HTTP/1.1 200 OK\r\nno colon here\r\nContent-Length: 1\r\n\r\na", "bad header line"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "bad chunk size"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n", "chunk not followed by CRLF"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nhello\r\n0\r\n\r\n", "chunk not followed by CRLF"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nab", "bytes after the response body"),
        (ok(b"x" * 2000), "response over 1024 bytes"),
    ],
)
async def test_malformed_responses_fail_and_drop_the_connection(
    raw: Callable[..., RawServer], reply: bytes, error: str
) -> None:
    s = raw(lambda i: reply if i == 0 else ok(b"fine"))
    await s.start()
    c = KeepAliveGet("127.0.0.1", s.port, "/m", max_bytes=1024)
    with pytest.raises(HTTPGetError, match=error):
        await c.get(10.0)
    assert await c.get(10.0) == (200, b"fine")  # a fresh connection
    assert s.connections == 2
    c.close()


async def test_truncated_body_timeout_and_refused(raw: Callable[..., RawServer]) -> None:
    s = raw(lambda i: b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\nConnection: close\r\n\r\nshort" if i == 0 else None)
    await s.start()
    c = KeepAliveGet("127.0.0.1", s.port, "/m")
    with pytest.raises(ConnectionError):
        await c.get(10.0)
    with pytest.raises(TimeoutError):
        await c.get(0.1)  # accepted, never answered
    await s.close()
    s.server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)  # another port; the old one refuses
    c2 = KeepAliveGet("127.0.0.1", s.port, "/m")
    with pytest.raises(OSError):
        await c2.get(10.0)


async def test_scraper_over_tls_with_verification_skipped(tmp_path: Path) -> None:
    subprocess.run(
        ["openssl", "req", "-x509", "-nodes", "-days", "2", "-subj", "/CN=pod", "-newkey", "rsa:2048",
         "-keyout", str(tmp_path / "k"), "-out", str(tmp_path / "c")],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(tmp_path / "c", tmp_path / "k")

    async def page(request: web.Request) -> web.Response:
        return web.Response(text=PAGE)

    app = web.Application()
    app.router.add_get("/metrics", page)
    async with serve_app(app, ssl_context=ctx) as port:
        ep = Endpoint("a", "127.0.0.1", port)
        ds = Datastore()
        ds.replace_all([ep])
        scraper = MetricsScraper(ds, interval=0.02, scheme="https", insecure_skip_verify=True)
        task = asyncio.create_task(scraper.run())
        try:
            for _ in range(200):
                if ep.metrics.waiting_queue_size == 3:
                    break
                await asyncio.sleep(0.01)
            assert ep.metrics.waiting_queue_size == 3 and ep.metrics.running_requests_size == 2
            assert scraper.failures == 0
            # Verification on: a self-signed certificate fails every scrape, and the failures count against the pod.
            strict = MetricsScraper(ds, interval=0.02, scheme="https", insecure_skip_verify=False)
            strict._ssl = strict._ssl_context()
            strict._running = True
            good, why = await strict.scrape_once(ep)
            assert not good and "CERTIFICATE_VERIFY_FAILED" in why
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
