"""Receive: the request headers (modes, subset hint, content-length) and the body gathered within its budgets.

A body is bounded three ways before it is parsed: its own size (`max_body_bytes`, 413 at the end of the body),
the bytes all streams are gathering at once (`max_inflight_body_bytes`, 503) and its deadline after the headers
(`body_timeout`, 408)."""

from __future__ import annotations

import asyncio
import logging
import time

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from epp.framework.errors import BadRequest, RequestError, ServiceUnavailable
from epp.framework.logthrottle import LogThrottle
from epp.framework.parsing import content_length
from epp.server.stages.state import HEADERS_DONE, StreamState

log = logging.getLogger("epp.server.extproc")
_body_throttle = LogThrottle()

SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"


class PayloadTooLarge(RequestError):
    status = 413
    code = "PayloadTooLarge"


def headers_of(msg: pb.HttpHeaders) -> dict[str, str]:
    out: dict[str, str] = {}
    for h in msg.headers.headers:
        out[h.key] = h.raw_value.decode("utf-8", "replace") if h.raw_value else h.value
    return out


def subset_hint(md: base_pb2.Metadata) -> list[str] | None:
    fm = md.filter_metadata
    if SUBSET_NAMESPACE not in fm:
        return None
    fields = fm[SUBSET_NAMESPACE].fields
    if SUBSET_KEY not in fields:
        return None
    value = fields[SUBSET_KEY]
    kind = value.WhichOneof("kind")
    if kind == "list_value":
        return [v.string_value for v in value.list_value.values if v.string_value]
    if kind == "string_value":  # tolerate a single comma list
        return [s for s in value.string_value.split(",") if s]
    return []


class Receive(StreamState):
    __slots__ = ()

    def _receive_headers(self, msg: pb.ProcessingRequest) -> None:
        """Take in the request headers: modes, the trace, the subset hint, the clock and the declared length."""
        if msg.HasField("protocol_config"):
            pc = msg.protocol_config
            self.request_mode = pc.request_body_mode
            self.response_mode = pc.response_body_mode
        self.headers = headers_of(msg.request_headers)
        if self.s.tracing is not None and self._span is None:
            self._span = self.s.tracing.start_request(self.headers)
        if msg.HasField("metadata_context"):
            self.subset = subset_hint(msg.metadata_context) if self.s.honor_subset_hint else None
        self.started = time.monotonic()
        self.started_loop = asyncio.get_running_loop().time()
        self.state = HEADERS_DONE
        declared = self.headers.get("content-length")
        try:
            length = -1 if declared is None else content_length(declared)
        except ValueError as e:  # the framing is invalid: a 400, as an HTTP server answers it (RFC 9112 6.3)
            raise BadRequest(str(e)) from None
        if length > self.s.max_body_bytes:
            # Refused without gathering a byte of it: its chunks are dropped as they come and the 413 goes out at
            # the end of the body. Answered before that, Envoy closes the connection while the client is still
            # sending, and a client that reads only after sending (most do) sees a reset, not the 413.
            self._too_large = True
        elif length >= 0:
            self._declared = length

    def _gather(self, body: pb.HttpBody) -> bool:
        """Add one body chunk within the budgets; True once the body is complete (end of stream)."""
        chunk = body.body
        if self._too_large:
            self._body_size += len(chunk)
            if body.end_of_stream:
                raise PayloadTooLarge(f"request body exceeds {self.s.max_body_bytes} bytes")
            return False
        if chunk:
            s = self.s
            gathered = self._body
            size = self._body_size
            end = size + len(chunk)
            # A declared length is allocated at the first chunk (and its budget held at once, so that a client
            # declaring much and sending little cannot make the EPP allocate past the budget): growing a bytearray
            # chunk by chunk reallocates it (~12% headroom a time), which below glibc's mmap threshold copies it
            # and leaves freed body-sized blocks in the heap (a large body's peak is then a multiple of its size).
            prealloc = (
                not gathered
                and not body.end_of_stream
                and self._declared > len(chunk)
                and s.inflight_body_bytes + self._declared <= s.max_inflight_body_bytes
            )
            need = (self._declared if prealloc else end) - self._held  # bytes not yet counted in the budget
            if need > 0:
                if s.inflight_body_bytes + need > s.max_inflight_body_bytes:
                    self._body = b""
                    self._release_body()
                    raise ServiceUnavailable("too many request body bytes in flight; retry later")
                s.inflight_body_bytes += need
                self._held += need
            if isinstance(gathered, bytearray):
                # In place: within the preallocated length no resize; past it (or without one), appended.
                gathered[size:end] = chunk
            elif prealloc:
                buf = bytearray(self._declared)
                buf[:end] = chunk
                self._body = buf
            elif not gathered:
                self._body = chunk
            else:
                self._body = bytearray(gathered) + chunk
            self._body_size = end
            if self._body_size > s.max_body_bytes:  # let it go; the rest is dropped as it comes
                self._body = b""
                self._release_body()
                self._too_large = True
                if body.end_of_stream:
                    raise PayloadTooLarge(f"request body exceeds {s.max_body_bytes} bytes")
                return False
        return body.end_of_stream

    def _release_body(self) -> None:
        """Give this stream's body bytes back to the global in-flight budget (idempotent)."""
        self.s.inflight_body_bytes -= self._held
        self._held = 0

    @property
    def awaiting_body(self) -> bool:
        """Headers in, the body not yet complete (the body deadline runs)."""
        return self.state == HEADERS_DONE and self.s.body_timeout > 0

    @property
    def body_deadline(self) -> float:
        """The loop time by which the body must be complete."""
        return self.started_loop + self.s.body_timeout

    def _body_timeout_error(self) -> RequestError:
        """The 408 for a body that did not complete in time; the stream's gathered bytes go back to the budget."""
        self.s.body_timeouts += 1
        got = self._body_size
        self._body = b""
        self._release_body()
        _body_throttle.log(
            log, logging.WARNING, "body_timeout", "request %s: body not complete %.0f s after its headers "
            "(%d bytes received): 408", self._request_id(), self.s.body_timeout, got,
        )  # fmt: skip
        return RequestError(
            f"request body not received within {self.s.body_timeout:g}s", status=408, code="RequestTimeout"
        )
