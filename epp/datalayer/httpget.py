"""A minimal keep-alive HTTP/1.1 GET for the metrics scraper: one connection per endpoint, one request at a time.

The scraper GETs every pod's /metrics every 50 ms (GIE's default) on the event loop that also serves ext_proc, so
its CPU competes with every request. aiohttp spends most of a scrape's CPU on its own machinery (request and
response objects, header multidicts, the connector, tracing hooks); this reads the status line, `Content-Length`
or chunked framing and the body straight from an asyncio.Protocol, a few times cheaper (bench_scraper).
A response that ends the connection (`Connection: close`, no length) is read to EOF and the next GET reconnects.
"""

from __future__ import annotations

import asyncio
import ssl
import string
from typing import Protocol, cast

from epp.framework.parsing import content_length

__all__ = ["HTTPGetError", "KeepAliveGet", "ResponseSink"]

_NO_BODY = (204, 304)
_HEX = frozenset(string.hexdigits.encode())


class HTTPGetError(Exception):
    """A malformed or oversized response (connection errors are OSError, timeouts TimeoutError)."""


class ResponseSink(Protocol):
    """Where one response goes: an asyncio.Future (`KeepAliveGet.get`), or an object whose `set_result` /
    `set_exception` run the caller's code straight from the protocol's callbacks (`KeepAliveGet.send`: no task,
    future or wake-up per GET)."""

    def done(self) -> bool: ...

    def set_result(self, result: tuple[int, bytes], /) -> None: ...

    def set_exception(self, exception: BaseException, /) -> None: ...


_READ_SIZE = 65536


class _Response(asyncio.BufferedProtocol):
    """Frames one response at a time out of the connection's bytes. Buffered: the transport reads into one buffer
    kept for the connection's life (a plain Protocol gets a fresh 256 KiB `recv` allocation per read, which cost more
    than the rest of a small page's scrape)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.buf = bytearray()
        self._rbuf = memoryview(bytearray(_READ_SIZE))
        self.waiter: ResponseSink | None = None
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.body_start = -1  # set once the header block is in
        self.length = -1  # Content-Length; -1 with chunked False = read to EOF
        self.chunked = False
        self.keep_alive = True
        self.pos = 0  # chunked: where the next chunk-size line starts
        self.body = bytearray()

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A duck-typed check: uvloop's TCP transport is not an asyncio.Transport subclass.
        assert hasattr(transport, "write")
        self.transport = cast(asyncio.Transport, transport)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._rbuf

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(self._rbuf[:nbytes])

    def data_received(self, data: bytes | memoryview) -> None:
        self.buf += data
        if self.waiter is None or self.waiter.done():
            if self.waiter is None:  # bytes nobody asked for: the connection is out of step
                self._fail(HTTPGetError("unexpected data on an idle connection"))
            return
        try:
            done = self._advance()
        except HTTPGetError as e:
            self._fail(e)
            return
        if done is not None:
            w, self.waiter = self.waiter, None  # answered: bytes after this, unasked for, are out of step
            w.set_result(done)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        w, self.waiter = self.waiter, None
        if w is None or w.done():
            return
        if self.body_start >= 0 and self.length < 0 and not self.chunked:  # framed by EOF: this is the end
            w.set_result((self.status, bytes(self.buf[self.body_start :])))
        else:
            w.set_exception(exc or ConnectionResetError("connection closed before the response ended"))

    def _fail(self, exc: Exception) -> None:
        w, self.waiter = self.waiter, None
        if w is not None and not w.done():
            w.set_exception(exc)
        self.close()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    # framing
    def _advance(self) -> tuple[int, bytes] | None:
        buf = self.buf
        if self.body_start < 0:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > 65536:
                    raise HTTPGetError("response header block over 64 KiB")
                return None
            self._headers(bytes(buf[:end]))
            self.body_start = end + 4
            self.pos = self.body_start
        if len(buf) > self.max_bytes:
            raise HTTPGetError(f"response over {self.max_bytes} bytes")
        if self.chunked:
            return self._chunks()
        if self.length >= 0:
            end = self.body_start + self.length
            if len(buf) < end:
                return None
            if len(buf) > end:
                raise HTTPGetError("bytes after the response body")
            return self._done(bytes(buf[self.body_start : end]))
        return None  # read to EOF (connection_lost ends it)

    def _headers(self, block: bytes) -> None:
        lines = block.split(b"\r\n")
        parts = lines[0].split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or len(parts[1]) != 3 or not parts[1].isdigit():
            raise HTTPGetError(f"bad status line {lines[0][:80]!r}")
        self.status = int(parts[1])
        if parts[0] == b"HTTP/1.0":
            self.keep_alive = False
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep:
                raise HTTPGetError(f"bad header line {line[:80]!r}")
            name = name.strip().lower()
            if name == b"content-length":
                try:
                    self.length = content_length(value)
                except ValueError:
                    raise HTTPGetError(f"bad Content-Length {value[:40]!r}") from None
                if self.length > self.max_bytes:
                    raise HTTPGetError(f"response over {self.max_bytes} bytes")
            elif name == b"transfer-encoding":
                self.chunked = value.strip().lower().endswith(b"chunked")
            elif name == b"connection":
                v = value.strip().lower()
                self.keep_alive = v == b"keep-alive" or (v != b"close" and self.keep_alive)
        if self.chunked:
            self.length = -1
        if self.status in _NO_BODY or 100 <= self.status < 200:
            self.chunked, self.length = False, 0
        if self.length < 0 and not self.chunked:
            self.keep_alive = False

    def _chunks(self) -> tuple[int, bytes] | None:
        buf, pos = self.buf, self.pos
        while True:
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                return None
            size_field = bytes(buf[pos:eol]).split(b";", 1)[0].strip(b" \t")
            if not 0 < len(size_field) <= 16 or not _HEX.issuperset(size_field):  # 1*HEXDIG: no sign, 0x or _
                raise HTTPGetError(f"bad chunk size {size_field[:20]!r}")
            size = int(size_field, 16)
            if size > self.max_bytes:
                raise HTTPGetError(f"response over {self.max_bytes} bytes")
            if size == 0:
                end = buf.find(b"\r\n\r\n", eol)  # trailers (usually none) end with an empty line
                if end < 0:
                    return None
                if len(buf) > end + 4:
                    raise HTTPGetError("bytes after the response body")
                return self._done(bytes(self.body))
            start, stop = eol + 2, eol + 2 + size
            if len(buf) < stop + 2:
                return None
            if buf[stop : stop + 2] != b"\r\n":
                raise HTTPGetError(f"chunk not followed by CRLF: {bytes(buf[stop : stop + 10])!r}")
            self.body += buf[start:stop]
            pos = self.pos = stop + 2

    def _done(self, body: bytes) -> tuple[int, bytes]:
        result = (self.status, body)
        if not self.keep_alive:
            self.close()
        self.buf.clear()
        self._reset()
        return result


class KeepAliveGet:
    """GET one URL over one kept-alive connection; reconnects after errors, timeouts and `Connection: close`."""

    def __init__(
        self,
        host: str,
        port: int,
        path: str,
        *,
        ssl_context: ssl.SSLContext | None = None,
        max_bytes: int = 64 << 20,
    ) -> None:
        self.host = host.strip("[]")
        self.port = port
        self.ssl_context = ssl_context
        self.max_bytes = max_bytes
        hostport = f"[{self.host}]:{port}" if ":" in self.host else f"{self.host}:{port}"
        self._request = (
            f"GET {path} HTTP/1.1\r\nHost: {hostport}\r\nUser-Agent: pyepp-scraper\r\n"
            "Accept: text/plain;version=0.0.4;q=0.9,*/*;q=0.1\r\n\r\n"
        ).encode("latin-1")
        self._proto: _Response | None = None
        self.connects = 0

    async def get(self, timeout: float) -> tuple[int, bytes]:
        """(status, body) of one GET; raises OSError, TimeoutError or HTTPGetError (and then drops the connection)."""
        try:
            async with asyncio.timeout(timeout):
                proto = self._proto
                if proto is None or proto.closed:
                    proto = await self._connect()
                loop = asyncio.get_running_loop()
                proto.waiter = waiter = loop.create_future()
                assert proto.transport is not None
                proto.transport.write(self._request)
                return await waiter
        except BaseException:
            self.close()
            raise
        finally:
            if self._proto is not None:
                self._proto.waiter = None

    def send(self, sink: ResponseSink) -> bool:
        """Start a GET over the open connection; its response or error goes to `sink` from the protocol's callbacks
        (no timeout here: the caller keeps the deadline and calls `abort`). False, and nothing sent, when no
        connection is open (then `get` connects)."""
        proto = self._proto
        if proto is None or proto.closed or proto.transport is None or proto.waiter is not None:
            return False
        proto.waiter = sink
        proto.transport.write(self._request)
        return True

    def abort(self) -> None:
        """Drop the connection and a GET in flight on it, without telling its sink (the caller gave up on it)."""
        if self._proto is not None:
            self._proto.waiter = None
        self.close()

    async def _connect(self) -> _Response:
        self.close()
        loop = asyncio.get_running_loop()
        _, proto = await loop.create_connection(
            lambda: _Response(self.max_bytes),
            self.host,
            self.port,
            ssl=self.ssl_context,
            server_hostname=self.host if self.ssl_context is not None else None,
        )
        self._proto = proto
        self.connects += 1
        return proto

    def close(self) -> None:
        if self._proto is not None:
            self._proto.close()
            self._proto = None
