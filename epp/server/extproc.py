"""The Envoy ext_proc servicer: one `RequestStream` per gRPC stream (= one HTTP request).

`RequestStream.handle` dispatches each ext_proc message to the stages in `epp.server.stages`, which a request meets
in this order: receive (`receive.py`: headers, the body within its budgets and deadline), parse (`parse.py`),
decide (`decide.py`: the director), answer (`answer.py`: the destination header OVERWRITE, content-length,
clear_route_cache, `envoy.lb` metadata, the body streamed back in chunks of at most 62,000 bytes; or an
ImmediateResponse with the API's error body) and response (`response.py`: status, body, usage, rewrite back,
eviction, completion exactly once). FULL_DUPLEX_STREAMED (GIE's default) holds the headers until the body is
decided; BUFFERED answers them at once (stripping any client-sent destination) and the decision rides on the body
response's header mutation.

Deferred work has one owner, the servicer: after the answers to a message are written it calls `written`, which
runs the director's deferred PreRequest records and a completion held past the last response body answer.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Iterable
from typing import Any

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from epp.framework.errors import InternalError, RequestError
from epp.server.stages.answer import BODY_CHUNK_LIMIT, immediate
from epp.server.stages.receive import PayloadTooLarge
from epp.server.stages.response import Respond
from epp.server.stages.state import (
    BODY_DONE,
    BUFFERED,
    COMPLETE,
    DEFAULT_BODY_TIMEOUT,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_INFLIGHT_BODY_BYTES,
    FULL_DUPLEX,
    ServerState,
)

__all__ = [
    "BODY_CHUNK_LIMIT",
    "DEFAULT_BODY_TIMEOUT",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_INFLIGHT_BODY_BYTES",
    "ExtProcServicer",
    "RequestStream",
    "ServerState",
    "immediate",
]

log = logging.getLogger(__name__)

_REQUEST_BODY_PASS = pb.ProcessingResponse(request_body=pb.BodyResponse())
_REQUEST_TRAILERS_PASS = pb.ProcessingResponse(request_trailers=pb.TrailersResponse())
_RESPONSE_TRAILERS_PASS = pb.ProcessingResponse(response_trailers=pb.TrailersResponse())


class RequestStream(Respond):
    """One HTTP request over one ext_proc stream: each message to its stage, in the order they come."""

    __slots__ = ()

    async def handle(self, msg: pb.ProcessingRequest) -> Iterable[pb.ProcessingResponse]:
        """The responses to one message: a list, or (a large request body streamed on) an iterable that makes
        them as they are written."""
        kind = msg.WhichOneof("request")
        try:
            if kind == "request_body":
                return await self._request_body(msg.request_body)
            if kind == "response_body":
                return self._response_body(msg.response_body)
            if kind == "request_headers":
                return self._request_headers(msg)
            if kind == "response_headers":
                return self._response_headers(msg)
            if kind == "request_trailers":
                return await self._request_trailers()
            if kind == "response_trailers":
                self.complete()
                return [_RESPONSE_TRAILERS_PASS]
            return []
        except RequestError as e:
            return [self._reject(e)]
        except Exception as e:
            # The cause goes to the log, never to the client (it could echo the body or our internals).
            log.exception("internal error handling %s (request %s): %s", kind, self._request_id(), type(e).__name__)
            return [self._reject(InternalError("internal error"))]

    def _request_headers(self, msg: pb.ProcessingRequest) -> list[pb.ProcessingResponse]:
        self._receive_headers(msg)
        if msg.request_headers.end_of_stream or self.request_mode not in (FULL_DUPLEX, BUFFERED):
            self._decide_bodyless()
            return [self._routing_headers(None)]
        if self.request_mode == BUFFERED:
            return [self._strip_client_routing()]
        return []  # FULL_DUPLEX: hold the headers until the body is complete

    async def _request_body(self, body: pb.HttpBody) -> Iterable[pb.ProcessingResponse]:
        if self.state >= BODY_DONE:  # STREAMED / BUFFERED_PARTIAL after a headers-time decision: pass through
            return [_REQUEST_BODY_PASS]
        if not self._gather(body):
            return []
        return await self._decide_releasing(end_of_stream=True)

    async def _request_trailers(self) -> Iterable[pb.ProcessingResponse]:
        """Trailers end a body that had no end_of_stream: decide now, the body chunks stay without EOS."""
        out: Iterable[pb.ProcessingResponse] = []
        if self._too_large:
            raise PayloadTooLarge(f"request body exceeds {self.s.max_body_bytes} bytes")
        if self.state < BODY_DONE:
            out = await self._decide_releasing(end_of_stream=False)
        return itertools.chain(out, [_REQUEST_TRAILERS_PASS])

    async def _decide_releasing(self, end_of_stream: bool) -> Iterable[pb.ProcessingResponse]:
        """Parse, decide and answer, giving the body's budget back once it is decided, or once a large body has
        been streamed on (its bytes stay alive until then)."""
        lazy = False
        try:
            parsed, request, forward, rewritten = await self._parse_body()
            await self._decide(parsed, request, len(forward))
            out = self._answer_decision(forward, rewritten, end_of_stream)
            lazy = not isinstance(out, list)
            return out
        finally:
            if not lazy:
                self._release_body()

    def body_timed_out(self) -> pb.ProcessingResponse:
        """The 408 for a body that did not complete in time."""
        return self._reject(self._body_timeout_error())

    def written(self) -> None:
        """The answers to a message are written: the PreRequest records and a completion deferred past them run
        now."""
        self.s.director.run_deferred()
        if self._complete_after_write:
            self._complete_after_write = False
            self.complete()


class ExtProcServicer(pb_grpc.ExternalProcessorServicer):
    """`envoy.service.ext_proc.v3.ExternalProcessor/Process`: one RequestStream per call."""

    def __init__(self, state: ServerState) -> None:
        self.state = state

    async def _evictable(self, stream: RequestStream, read: Any, write: Any) -> None:
        """The rest of a stream flow control may evict: each read races the eviction event. Evicted before the
        response is complete → an ImmediateResponse 429, which makes Envoy reset the upstream request."""
        event = stream.eviction
        assert event is not None
        evicted = asyncio.ensure_future(event.wait())
        try:
            while True:
                reading = asyncio.ensure_future(read())
                await asyncio.wait((reading, evicted), return_when=asyncio.FIRST_COMPLETED)
                if evicted.done() and not reading.done() and stream.state != COMPLETE:
                    reading.cancel()
                    await write(stream.evict())
                    return
                msg = await reading
                if msg is grpc.aio.EOF:
                    return
                for resp in await stream.handle(msg):
                    await write(resp)
                stream.written()
        finally:
            evicted.cancel()

    async def Process(self, request_iterator: object, context: grpc.aio.ServicerContext) -> None:
        """Read/write on the context rather than an async generator: measurably fewer hops per message."""
        stream = RequestStream(self.state)
        stream.defer_completion = True
        self.state.active_streams += 1
        read, write, eof = context.read, context.write, grpc.aio.EOF
        try:
            while True:
                if stream.awaiting_body:
                    try:
                        async with asyncio.timeout_at(stream.body_deadline):
                            msg = await read()
                    except TimeoutError:
                        await write(stream.body_timed_out())
                        break
                else:
                    msg = await read()
                if msg is eof:
                    break
                for resp in await stream.handle(msg):
                    await write(resp)
                stream.written()
                if stream.eviction is not None:  # flow-control eviction: watch for it alongside the stream
                    await self._evictable(stream, read, write)
                    break
        finally:
            self.state.active_streams -= 1
            stream.complete()
