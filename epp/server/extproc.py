"""The Envoy ext_proc servicer: one `RequestStream` state machine per gRPC stream (= one HTTP request).

Request path, FULL_DUPLEX_STREAMED (GIE's default): headers are held, body chunks are gathered until end of
stream, the request is parsed and the `Director` decides; then the headers phase is answered (destination header
OVERWRITE, content-length, clear_route_cache, `envoy.lb` dynamic metadata) and the (possibly rewritten) body is
streamed back in chunks of at most 62,000 bytes. BUFFERED: the headers phase is answered at once (stripping any
client-sent destination), and the decision rides on the body response's header mutation.

Response path: status and content type from the headers, the body is passed back chunk by chunk (model name
rewritten back to the client's; then the upstream content-length is dropped at the headers phase, and in BUFFERED
mode set to the rewritten body's length), usage read from JSON or SSE, and `handle_response_complete` runs
exactly once, also when the stream dies early. Every failure becomes an ImmediateResponse with a JSON error body.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from envoy.type.v3 import http_status_pb2

from epp.framework.attributes import RESPONSE_METADATA
from epp.framework.context import EndpointView
from epp.framework.errors import (
    DROPPED_EVICTED,
    DROPPED_NO_ENDPOINTS,
    DROPPED_REASON_HEADER,
    BadRequest,
    InternalError,
    RequestError,
    ServiceUnavailable,
    TooManyRequests,
)
from epp.framework.keys import DISAGG_HEADERS
from epp.framework.logthrottle import LogThrottle
from epp.framework.parsing import (
    LARGE_BODY_BYTES,
    NoParser,
    ParsedRequest,
    ParserRegistry,
    RequestParser,
    content_length,
    request_path,
)
from epp.framework.types import InferenceRequest, Usage
from epp.framework.verbosity import VERBOSE, V
from epp.protocol.openai import bodyless_request, build_request
from epp.protocol.rewrite import ModelNameRewriter
from epp.protocol.usage import MAX_JSON_USAGE_BYTES, SSEUsageReader, usage_from_json
from epp.requestcontrol.types import Director, RoutingDecision, locate_candidates
from epp.server.memtrim import TRIM_AFTER_BODY_BYTES, MemoryTrimmer
from epp.server.metrics import RequestMetrics
from epp.wiring.builtins import default_parsers

log = logging.getLogger(__name__)


class PayloadTooLarge(RequestError):
    status = 413
    code = "PayloadTooLarge"


DESTINATION_KEY = "x-gateway-destination-endpoint"
DESTINATION_NAMESPACE = "envoy.lb"
SCORES_KEY = "x-gateway-destination-endpoint-scores"  # envoy.lb metadata with --emit-endpoint-scores
SERVED_METADATA_KEY = "x-gateway-destination-endpoint-served"  # envoy.lb metadata: the endpoint that served
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
BODY_CHUNK_LIMIT = 62_000  # GIE's BodyByteLimit: Envoy takes at most 64 KiB per streamed chunk
ROUTING_WIRE_CACHE = 4096  # destinations whose routing answer is kept serialized (cleared when full)
DEFAULT_MAX_BODY_BYTES = 128 * 1024 * 1024  # a gathered request body beyond this is refused with 413
# All request bodies being gathered at once, across streams: past it a body is refused with 503 (parsing multiplies
# a body several times over, so this bounds the EPP's peak memory, not just the raw bytes).
DEFAULT_MAX_INFLIGHT_BODY_BYTES = 256 * 1024 * 1024
# A request body not complete this long after its headers: 408, and the stream (and what it holds) ends. Envoy's
# own idle timeouts (300 s) would hold it ~20 KB a stream meanwhile.
DEFAULT_BODY_TIMEOUT = 30.0
_body_throttle = LogThrottle()

_Mode = processing_mode_pb2.ProcessingMode
FULL_DUPLEX = _Mode.FULL_DUPLEX_STREAMED
BUFFERED = _Mode.BUFFERED
_OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
_JSON_CT = base_pb2.HeaderValueOption(
    header=base_pb2.HeaderValue(key="content-type", raw_value=b"application/json"), append_action=_OVERWRITE
)

# Answers that never vary, built once (never mutated after: dynamic metadata goes on fresh responses only).
_RESPONSE_HEADERS_PASS = pb.ProcessingResponse(response_headers=pb.HeadersResponse())
_REQUEST_BODY_PASS = pb.ProcessingResponse(request_body=pb.BodyResponse())
_REQUEST_TRAILERS_PASS = pb.ProcessingResponse(request_trailers=pb.TrailersResponse())
_RESPONSE_TRAILERS_PASS = pb.ProcessingResponse(response_trailers=pb.TrailersResponse())

# Request states, as in GIE's handlers/server.go.
_RECEIVED, _HEADERS_DONE, _BODY_DONE, _RESPONSE, _RESPONSE_HEADERS_DONE, _COMPLETE = range(6)


def _set(key: str, value: str) -> base_pb2.HeaderValueOption:
    return base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key=key, raw_value=value.encode()), append_action=_OVERWRITE
    )


def _headers(msg: pb.HttpHeaders) -> dict[str, str]:
    out: dict[str, str] = {}
    for h in msg.headers.headers:
        out[h.key] = h.raw_value.decode("utf-8", "replace") if h.raw_value else h.value
    return out


def _subset_hint(md: base_pb2.Metadata) -> list[str] | None:
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


def _served(md: base_pb2.Metadata) -> str | None:
    fm = md.filter_metadata
    if DESTINATION_NAMESPACE in fm:
        fields = fm[DESTINATION_NAMESPACE].fields
        if SERVED_METADATA_KEY in fields:
            return fields[SERVED_METADATA_KEY].string_value or None
    return None


# gRPC status codes for the HTTP statuses the EPP answers with (gRPC APIs get a gRPC error, not a JSON body).
_GRPC_STATUS = {400: 3, 404: 12, 413: 8, 429: 8, 500: 13, 503: 14}


def immediate(err: RequestError, error_format: str = "openai") -> pb.ProcessingResponse:
    """An ImmediateResponse in the API's error shape: OpenAI-style JSON, Anthropic's JSON, or a gRPC status."""
    dropped = [_set(DROPPED_REASON_HEADER, err.dropped_reason)] if err.dropped_reason else []
    if error_format == "grpc":
        return pb.ProcessingResponse(
            immediate_response=pb.ImmediateResponse(
                status=http_status_pb2.HttpStatus(code=err.status),
                headers=pb.HeaderMutation(set_headers=dropped, remove_headers=[DESTINATION_KEY]),
                grpc_status=pb.GrpcStatus(status=_GRPC_STATUS.get(err.status, 2)),
                body=err.message.encode(),
                details=f"epp_{err.code}",
            )
        )
    return pb.ProcessingResponse(
        immediate_response=pb.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=err.status),
            headers=pb.HeaderMutation(set_headers=[_JSON_CT, *dropped], remove_headers=[DESTINATION_KEY]),
            body=err.body(error_format),
            details=f"epp_{err.code}",
        )
    )


def _chunks(parts: list[bytes], limit: int = BODY_CHUNK_LIMIT) -> list[bytes]:
    """Split into pieces of at most `limit` bytes, reusing parts that already fit (no copies for them)."""
    out: list[bytes] = []
    for part in parts:
        if len(part) <= limit:
            if part:
                out.append(part)
            continue
        mv = memoryview(part)
        out.extend(bytes(mv[i : i + limit]) for i in range(0, len(part), limit))
    return out


class ServerState:
    """What every stream shares: the director, the datastore, metrics, rewrites and mode defaults."""

    def __init__(
        self,
        director: Director,
        datastore: EndpointView,
        metrics: RequestMetrics,
        model_rewrites: Mapping[str, str] | None = None,
        request_body_mode: int = FULL_DUPLEX,
        response_body_mode: int = FULL_DUPLEX,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        parsers: ParserRegistry | None = None,
        emit_endpoint_scores: bool = False,
        max_inflight_body_bytes: int = DEFAULT_MAX_INFLIGHT_BODY_BYTES,
    ) -> None:
        self.director = director
        self.parsers = parsers if parsers is not None else default_parsers()
        self.emit_endpoint_scores = emit_endpoint_scores
        self.datastore = datastore
        self.metrics = metrics
        self.model_rewrites = dict(model_rewrites or {})
        self.request_body_mode = request_body_mode
        self.response_body_mode = response_body_mode
        self.max_body_bytes = max_body_bytes
        self.max_inflight_body_bytes = max_inflight_body_bytes
        self.inflight_body_bytes = 0  # held by streams gathering (or parsing) a request body
        self.active_streams = 0
        self.trimmer = MemoryTrimmer()  # heap pages back to the OS after large bodies
        self._bodyless_next = 0
        self.honor_subset_hint = True  # --disable-endpoint-subset-filter turns it off
        self.body_timeout = DEFAULT_BODY_TIMEOUT  # --request-body-timeout (0: none)
        self.body_timeouts = 0
        self.tracing: Any = None  # epp.server.tracing.Tracing with --tracing (spans per request)
        self._parse_pool: ThreadPoolExecutor | None = None
        # destination -> the serialized request-headers answer of a decision that sets only the destination
        self.routing_wire: dict[str, bytes] = {}

    def parse_pool(self) -> ThreadPoolExecutor:
        """The one thread that parses large request bodies (one at a time: each is bounded by the body limits)."""
        if self._parse_pool is None:
            self._parse_pool = ThreadPoolExecutor(1, thread_name_prefix="epp-parse")
        return self._parse_pool

    def pick_bodyless(self, subset: list[str] | None) -> RoutingDecision:
        """Body-less requests (GET /v1/models...) skip scheduling: round-robin over the candidates."""
        candidates = locate_candidates(self.datastore.endpoints(), subset)
        if not candidates:
            raise ServiceUnavailable("no ready endpoints in the pool", dropped_reason=DROPPED_NO_ENDPOINTS)
        self._bodyless_next += 1
        return RoutingDecision(endpoints=[candidates[self._bodyless_next % len(candidates)]])


class RequestStream:
    """The state of one HTTP request as seen over one ext_proc stream."""

    __slots__ = (
        "_body",
        "_body_size",
        "_chunks",
        "_complete_after_write",
        "_declared",
        "_error_format",
        "_held",
        "_resp_json",
        "_restore_length",
        "_rewriter",
        "_skip_response",
        "_span",
        "_sse",
        "_too_large",
        "decision",
        "defer_completion",
        "headers",
        "model_routed",
        "request",
        "request_mode",
        "response_mode",
        "response_size",
        "s",
        "started",
        "started_loop",
        "state",
        "status",
        "subset",
    )

    def __init__(self, state: ServerState) -> None:
        self.s = state
        self.state = _RECEIVED
        self.request_mode = state.request_body_mode
        self.response_mode = state.response_body_mode
        self.headers: dict[str, str] = {}
        self.subset: list[str] | None = None
        # The body gathered so far: the first chunk as it came; from the second on, one growing bytearray (a list
        # of chunks left a body's worth of freed small blocks resident in the heap once joined).
        self._body: bytes | bytearray = b""
        self._body_size = 0
        self._declared = 0  # the body's content-length when declared and within the limit (0: unknown)
        self._held = 0  # bytes of this stream's body counted in ServerState.inflight_body_bytes
        self._too_large = False  # over the size limit: chunks are dropped until the 413 at the end of the body
        self._error_format = ""  # the API's error shape, known once a parser is chosen (see _format)
        self.request: InferenceRequest | None = None
        self.decision: RoutingDecision | None = None
        self.model_routed = False  # True once the director accepted the request (it must see completion)
        self.started = 0.0
        self.started_loop = 0.0
        self.status = 0
        self.response_size = 0
        self._chunks = 0  # response body messages seen
        self._rewriter: ModelNameRewriter | None = None
        self._span: Any = None  # the request's gateway.request span (--tracing)
        self._restore_length = False  # content-length dropped at response headers (body rewritten)
        self._sse: SSEUsageReader | None = None
        self._skip_response = False  # the parser's SkipResponseProcessing: no usage read from the response
        self._resp_json: list[bytes] | None = None
        # Set by the servicer: the end of the response is answered first and completed right after the answer is
        # written (usage, metrics and the director's ResponseComplete hooks are then off the client's path).
        self.defer_completion = False
        self._complete_after_write = False

    # -- dispatch ---------------------------------------------------------------------------------------------

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
                return await self._request_headers(msg)
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

    def _request_id(self) -> str:
        if self.request is not None:
            return self.request.request_id
        return self.headers.get("x-request-id", "?")

    def _end_span(self, error: str | None = None) -> None:
        span, self._span = self._span, None
        req, decision = self.request, self.decision
        attributes = {
            "gen_ai.request.model": req.model if req is not None else None,
            "gen_ai.request.target_model": req.target_model if req is not None else None,
            "x-request-id": self.headers.get("x-request-id"),
            "x-gateway-destination-endpoint": decision.destination if decision is not None else None,
            "http.response.status_code": self.status or None,
        }
        self.s.tracing.finish(span, attributes, error)

    def _reject(self, err: RequestError) -> pb.ProcessingResponse:
        if self._span is not None:
            self._end_span(f"{err.status} {err.code}")
        req = self.request
        level = logging.WARNING if err.status >= 500 else logging.INFO
        log.log(level, "request %s rejected with %d: %s", self._request_id(), err.status, err.message)
        if req is not None and req.model:
            self.s.metrics.request_error(req.model, req.target_model, err.code)
        self.state = _COMPLETE
        return immediate(err, self._format())

    def _format(self) -> str:
        """The error shape of the request's API: its parser's, also before the body is parsed (a 413 or 503 while
        gathering it), so an Anthropic client gets Anthropic's shape; OpenAI's when no parser claims the path."""
        if not self._error_format:
            try:
                self._error_format = self.s.parsers.resolve(request_path(self.headers)).error_format
            except NoParser:
                self._error_format = "openai"
        return self._error_format

    @property
    def awaiting_body(self) -> bool:
        """Headers in, the body not yet complete (the body deadline runs)."""
        return self.state == _HEADERS_DONE and self.s.body_timeout > 0

    @property
    def body_deadline(self) -> float:
        """The loop time by which the body must be complete."""
        return self.started_loop + self.s.body_timeout

    def body_timed_out(self) -> pb.ProcessingResponse:
        """The 408 for a body that did not complete in time; the stream's gathered bytes go back to the budget."""
        self.s.body_timeouts += 1
        got = self._body_size
        self._body = b""
        self._release_body()
        _body_throttle.log(
            log, logging.WARNING, "body_timeout", "request %s: body not complete %.0f s after its headers "
            "(%d bytes received): 408", self._request_id(), self.s.body_timeout, got,
        )  # fmt: skip
        err = RequestError(
            f"request body not received within {self.s.body_timeout:g}s", status=408, code="RequestTimeout"
        )
        return self._reject(err)

    # -- request path -----------------------------------------------------------------------------------------

    async def _request_headers(self, msg: pb.ProcessingRequest) -> list[pb.ProcessingResponse]:
        if msg.HasField("protocol_config"):
            pc = msg.protocol_config
            self.request_mode = pc.request_body_mode
            self.response_mode = pc.response_body_mode
        self.headers = _headers(msg.request_headers)
        if self.s.tracing is not None and self._span is None:
            self._span = self.s.tracing.start_request(self.headers)
        if msg.HasField("metadata_context"):
            self.subset = _subset_hint(msg.metadata_context) if self.s.honor_subset_hint else None
        self.started = time.monotonic()
        self.started_loop = asyncio.get_running_loop().time()
        self.state = _HEADERS_DONE
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
        if msg.request_headers.end_of_stream or self.request_mode not in (FULL_DUPLEX, BUFFERED):
            # No body will reach us before the headers must be answered: route without scheduling.
            self.request = bodyless_request(self.headers)
            self.request.subset = self.subset
            self.decision = self.s.pick_bodyless(self.subset)
            self.state = _BODY_DONE
            return [self._routing_headers(None)]
        if self.request_mode == BUFFERED:
            strip = pb.CommonResponse(
                header_mutation=pb.HeaderMutation(remove_headers=[DESTINATION_KEY, *DISAGG_HEADERS])
            )
            return [pb.ProcessingResponse(request_headers=pb.HeadersResponse(response=strip))]
        return []  # FULL_DUPLEX: hold the headers until the body is complete

    async def _request_body(self, body: pb.HttpBody) -> Iterable[pb.ProcessingResponse]:
        if self.state >= _BODY_DONE:  # STREAMED / BUFFERED_PARTIAL after a headers-time decision: pass through
            return [_REQUEST_BODY_PASS]
        chunk = body.body
        if self._too_large:
            self._body_size += len(chunk)
            if body.end_of_stream:
                raise PayloadTooLarge(f"request body exceeds {self.s.max_body_bytes} bytes")
            return []
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
                return []
        if not body.end_of_stream:
            return []
        return await self._decide_releasing(end_of_stream=True)

    def _release_body(self) -> None:
        """Give this stream's body bytes back to the global in-flight budget (idempotent)."""
        self.s.inflight_body_bytes -= self._held
        self._held = 0

    async def _request_trailers(self) -> Iterable[pb.ProcessingResponse]:
        """Trailers end a body that had no end_of_stream: decide now, the body chunks stay without EOS."""
        out: Iterable[pb.ProcessingResponse] = []
        if self._too_large:
            raise PayloadTooLarge(f"request body exceeds {self.s.max_body_bytes} bytes")
        if self.state < _BODY_DONE:
            out = await self._decide_releasing(end_of_stream=False)
        return itertools.chain(out, [_REQUEST_TRAILERS_PASS])

    async def _decide_releasing(self, end_of_stream: bool) -> Iterable[pb.ProcessingResponse]:
        """`_decide`, giving the body's budget back once it is decided, or once a large body has been streamed on
        (its bytes stay alive until then)."""
        lazy = False
        try:
            out = await self._decide(end_of_stream)
            lazy = not isinstance(out, list)
            return out
        finally:
            if not lazy:
                self._release_body()

    def _stream_body(self, body: bytes, end_of_stream: bool) -> Iterator[pb.ProcessingResponse]:
        """The body's streamed pieces, made one at a time as they are written: a large body is not copied into
        a list of messages first (that was one more body-sized copy alive)."""
        try:
            mv = memoryview(body)
            del body
            n = len(mv)
            for i in range(0, n, BODY_CHUNK_LIMIT):
                resp = pb.ProcessingResponse()
                sr = resp.request_body.response.body_mutation.streamed_response
                sr.body = bytes(mv[i : i + BODY_CHUNK_LIMIT])
                sr.end_of_stream = end_of_stream and i + BODY_CHUNK_LIMIT >= n
                yield resp
        finally:
            self._release_body()

    async def _decide(self, end_of_stream: bool) -> Iterable[pb.ProcessingResponse]:
        gathered = self._body
        if isinstance(gathered, bytearray) and len(gathered) > self._body_size:
            del gathered[self._body_size :]  # less came than was declared (the rest of the preallocation)
        # The body goes in a box that `_parse` empties: no reference to the gathered bytes stays here meanwhile.
        box, self._body = [gathered], b""
        del gathered
        path = request_path(self.headers)
        try:
            parser = self.s.parsers.resolve(path)
        except NoParser as e:
            raise BadRequest(str(e)) from None
        self._error_format = parser.error_format
        if len(box[0]) >= LARGE_BODY_BYTES:
            # Parsed on the parse thread: on the loop, a 100 MiB prompt stalled every other stream for the whole
            # parse (see LARGE_BODY_BYTES for what still holds the GIL).
            parsed, request, forward, rewritten = await asyncio.get_running_loop().run_in_executor(
                self.s.parse_pool(), self._parse, parser, box
            )
        else:
            parsed, request, forward, rewritten = self._parse(parser, box)
        if parsed.skip_response:
            self._skip_response = True
        request.subset = self.subset
        self.request = request
        # Behind the servicer the records-only PreRequest hooks run once this answer is written (`written`).
        defer = self.defer_completion
        if self._span is not None:
            with self.s.tracing.orchestration(self._span):
                decision = await self.s.director.handle_request(request, defer_records=defer)
        else:
            decision = await self.s.director.handle_request(request, defer_records=defer)
        if not decision.endpoints:
            raise ServiceUnavailable("failed to find target endpoint", dropped_reason=DROPPED_NO_ENDPOINTS)
        self.decision = decision
        self.model_routed = True
        self.state = _BODY_DONE
        self.s.metrics.request_started(request.model, request.target_model, request.priority, len(forward))
        if request.target_model != request.model:
            self._rewriter = ModelNameRewriter(request.target_model, request.model)
        if self.request_mode == BUFFERED:
            common = self._routing_common(len(forward))
            if rewritten:
                common.body_mutation.body = forward
            resp = pb.ProcessingResponse(request_body=pb.BodyResponse(response=common))
            self._put_metadata(resp)
            return [resp]
        resp = self._routing_headers(len(forward))
        if len(forward) > BODY_CHUNK_LIMIT:
            return itertools.chain([resp], self._stream_body(forward, end_of_stream))
        out = [resp]
        if forward:
            common = pb.CommonResponse()
            common.body_mutation.streamed_response.body = forward
            common.body_mutation.streamed_response.end_of_stream = end_of_stream
            out.append(pb.ProcessingResponse(request_body=pb.BodyResponse(response=common)))
        return out

    def _parse(
        self, parser: RequestParser, box: list[bytes | bytearray]
    ) -> tuple[ParsedRequest, InferenceRequest, bytes, bool]:
        """Parse the body (taken out of `box`) and build the request: the parsed body, the request, the body to
        forward and whether that is a rewrite. Runs on the parse thread for a large body: it touches no shared
        state."""
        gathered = box.pop()
        # One copy into bytes, the bytearray let go at once: a large body is held one time over while it is parsed.
        raw = gathered if isinstance(gathered, bytes) else bytes(gathered)
        del gathered
        parsed = parser.parse(self.headers, raw)
        request, forward = build_request(self.headers, parsed, raw, self.s.model_rewrites)
        return parsed, request, forward, forward is not raw

    def _routing_headers(self, content_length: int | None) -> pb.ProcessingResponse:
        """The request-headers answer for the decision: header mutation, content-length and `envoy.lb` metadata.

        A decision that sets nothing but the destination (no extra headers or metadata, no trace, no scores) is parsed
        from a serialization kept per destination, with the content-length appended: parsing those bytes is much
        cheaper than building the nested messages field by field for every request."""
        d = self.decision
        assert d is not None
        s = self.s
        if d.headers or d.metadata or self._span is not None or s.emit_endpoint_scores:
            resp = pb.ProcessingResponse(
                request_headers=pb.HeadersResponse(response=self._routing_common(content_length))
            )
            self._put_metadata(resp)
            return resp
        destination = d.destination
        wire = s.routing_wire.get(destination)
        if wire is None:
            built = pb.ProcessingResponse(request_headers=pb.HeadersResponse(response=self._routing_common(None)))
            self._put_metadata(built)
            wire = built.SerializeToString()
            if len(s.routing_wire) >= ROUTING_WIRE_CACHE:
                s.routing_wire.clear()
            s.routing_wire[destination] = wire
        resp = pb.ProcessingResponse.FromString(wire)
        if content_length is not None:
            opt = resp.request_headers.response.header_mutation.set_headers.add()
            opt.header.key = "content-length"
            opt.header.raw_value = str(content_length).encode()
            opt.append_action = _OVERWRITE
        return resp

    def _routing_common(self, content_length: int | None) -> pb.CommonResponse:
        """The header mutation (and the dynamic metadata, set by the caller's response) for the decision."""
        assert self.decision is not None
        destination = self.decision.destination
        set_headers = [_set(DESTINATION_KEY, destination)]
        if content_length is not None:
            set_headers.append(_set("content-length", str(content_length)))
        for k, v in self.decision.headers.items():
            set_headers.append(_set(k, v))
        if self._span is not None:  # the trace continues upstream
            for k, v in self.s.tracing.inject(self._span).items():
                set_headers.append(_set(k, v))
        # A client-sent prefiller/encoder header never reaches the model server's sidecar: ours or none.
        remove = [h for h in DISAGG_HEADERS if h not in self.decision.headers]
        mutation = pb.HeaderMutation(set_headers=set_headers, remove_headers=remove)
        return pb.CommonResponse(header_mutation=mutation, clear_route_cache=True)

    def _put_metadata(self, resp: pb.ProcessingResponse) -> None:
        """`dynamic_metadata()` into the response: string values set field by field (3x cheaper than converting
        the dict into a Struct), anything else through the generic conversion."""
        lb = resp.dynamic_metadata.fields[DESTINATION_NAMESPACE].struct_value
        fields = lb.fields
        rest: dict[str, Any] | None = None
        for k, v in self.dynamic_metadata()[DESTINATION_NAMESPACE].items():
            if type(v) is str:
                fields[k].string_value = v
            else:
                if rest is None:
                    rest = {}
                rest[k] = v
        if rest:
            lb.update(rest)

    def dynamic_metadata(self) -> dict[str, Any]:
        assert self.decision is not None
        lb: dict[str, Any] = dict(self.decision.metadata)
        lb[DESTINATION_KEY] = self.decision.destination
        result = self.decision.result
        if self.s.emit_endpoint_scores and result is not None:
            primary = result.profile_results.get(result.primary_profile)
            if primary is not None and primary.candidates:
                lb[SCORES_KEY] = {ep.hostport: score for ep, score in primary.candidates}
        return {DESTINATION_NAMESPACE: lb}

    # -- response path ----------------------------------------------------------------------------------------

    def _response_headers(self, msg: pb.ProcessingRequest) -> list[pb.ProcessingResponse]:
        headers = _headers(msg.response_headers)
        try:
            self.status = int(headers.get(":status", "0"))
        except ValueError:
            self.status = 0
        self.state = _RESPONSE_HEADERS_DONE
        req = self.request
        if req is not None and self.model_routed:
            if not 200 <= self.status < 300:
                self.s.metrics.request_error(req.model, req.target_model, "ModelServerError")
            served = _served(msg.metadata_context) if msg.HasField("metadata_context") else None
            assert self.decision is not None
            try:
                self.s.director.handle_response_headers(req, self.decision, self.status, served, headers)
            except Exception:  # a plugin bug must not turn a good response into an error
                log.exception("director.handle_response_headers failed for request %s", req.request_id)
            if self._skip_response:
                pass
            elif "text/event-stream" in headers.get("content-type", ""):
                self._sse = SSEUsageReader()
            else:
                self._resp_json = []
        if msg.response_headers.end_of_stream:
            self.complete()
        # Headers the director's response hooks added (e.g. session-affinity's token).
        extra = self.decision.response_headers if self.decision is not None else None
        set_headers = [_set(k, str(v)) for k, v in extra.items()] if extra else []
        remove: list[str] = []
        if self._rewriter is not None and not msg.response_headers.end_of_stream and "content-length" in headers:
            # The body will have the model name rewritten back, so its length may change and the upstream's
            # content-length would be stale (in BUFFERED mode Envoy answers a length-changing body mutation
            # with a 500). Drop it, as GIE does: Envoy then frames the body itself (chunked on HTTP/1.1), and
            # in BUFFERED mode the body response sets the exact new length.
            remove.append("content-length")
            self._restore_length = True
        if set_headers or remove:
            mutation = pb.HeaderMutation(set_headers=set_headers, remove_headers=remove)
            return [
                pb.ProcessingResponse(
                    response_headers=pb.HeadersResponse(response=pb.CommonResponse(header_mutation=mutation))
                )
            ]
        return [_RESPONSE_HEADERS_PASS]

    def _response_body(self, body: pb.HttpBody) -> list[pb.ProcessingResponse]:
        chunk = body.body
        eos = body.end_of_stream
        self.response_size += len(chunk)
        self._chunks += 1
        req = self.request
        if self.model_routed and req is not None:
            try:
                self.s.director.handle_response_chunk(req, self.decision, chunk, self._chunks == 1, eos)
            except Exception:
                log.exception("director.handle_response_chunk failed")
        if self._sse is not None:
            self._sse.feed(chunk)
        elif self._resp_json is not None:
            if self.response_size <= MAX_JSON_USAGE_BYTES:
                self._resp_json.append(chunk)
            else:  # too big to parse for usage: stop holding it
                self._resp_json = None
        if self._rewriter is not None:
            # BUFFERED: this one message is the whole body (end_of_stream is false only when trailers follow), so
            # nothing may be held back for a later chunk.
            out_chunk = self._rewriter.feed(chunk, eos or self.response_mode == BUFFERED)
        else:
            out_chunk = chunk
        reported: dict[str, Any] | None = None
        if eos:
            if self.defer_completion and not self.s.director.completes_before_last_answer:
                self._complete_after_write = True
            else:
                self.complete()
                if req is not None:  # request-attribute-reporter: dynamic metadata with the last body message
                    reported = req.data.get(RESPONSE_METADATA)
        if self.response_mode == FULL_DUPLEX:
            if len(out_chunk) <= BODY_CHUNK_LIMIT:  # the common case (an SSE event): one response, no lists
                resp = pb.ProcessingResponse()
                sr = resp.response_body.response.body_mutation.streamed_response
                sr.body = out_chunk
                sr.end_of_stream = eos
                if reported:
                    resp.dynamic_metadata.update(reported)
                return [resp]
            pieces = _chunks([out_chunk])
            out = []
            last = len(pieces) - 1
            for i, piece in enumerate(pieces):
                common = pb.CommonResponse()
                common.body_mutation.streamed_response.body = piece
                common.body_mutation.streamed_response.end_of_stream = eos and i == last
                out.append(pb.ProcessingResponse(response_body=pb.BodyResponse(response=common)))
            if reported:
                out[-1].dynamic_metadata.update(reported)
            return out
        common = pb.CommonResponse()
        if out_chunk is not chunk:
            common.body_mutation.body = out_chunk
        if self._restore_length and self.response_mode == BUFFERED:
            # The whole body is in this one message and Envoy still holds the headers; it applies this header
            # mutation before checking content-length against the mutated body.
            common.header_mutation.set_headers.append(_set("content-length", str(len(out_chunk))))
        resp = pb.ProcessingResponse(response_body=pb.BodyResponse(response=common))
        if reported:
            resp.dynamic_metadata.update(reported)
        return [resp]

    @property
    def eviction(self) -> asyncio.Event | None:
        """The decision's eviction event while the response is still under way (flowControl.enableEviction)."""
        d = self.decision
        return d.evicted if d is not None and self.state != _COMPLETE else None

    def evict(self) -> pb.ProcessingResponse:
        """Flow control revoked this in-flight request: end it with a 429 (the director hears completion)."""
        log.log(V(VERBOSE), "request %s evicted by flow control", self.request.request_id if self.request else "?")
        self.complete()
        evicted = TooManyRequests("request evicted by flow control", dropped_reason=DROPPED_EVICTED)
        return immediate(evicted, self._format())

    def written(self) -> None:
        """The answers to a message are written: the PreRequest records and a completion deferred past them run
        now."""
        self.s.director.run_deferred()
        if self._complete_after_write:
            self._complete_after_write = False
            self.complete()

    def complete(self) -> None:
        """Record usage and tell the director, exactly once per routed request (also on early stream end)."""
        self._release_body()
        if self._body_size >= TRIM_AFTER_BODY_BYTES:
            self._body_size = 0
            self.s.trimmer.request()
        self.state = _COMPLETE
        if self._span is not None:
            self._end_span()
        if not self.model_routed:
            return
        self.model_routed = False
        req = self.request
        assert req is not None
        usage: Usage | None = None
        if self._sse is not None:
            self._sse.close()
            usage = self._sse.usage
        elif self._resp_json:
            usage = usage_from_json(b"".join(self._resp_json))
            self._resp_json = None
        elapsed = time.monotonic() - self.started
        try:
            self.s.metrics.request_finished(req.model, req.target_model, elapsed, self.response_size, usage)
        except Exception:  # metrics must not cost the director its end-of-request hook
            log.exception("recording metrics failed for request %s", req.request_id)
        try:
            self.s.director.handle_response_complete(req, self.decision, usage)
        except Exception:
            log.exception("director.handle_response_complete failed for request %s", req.request_id)


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
                if evicted.done() and not reading.done() and stream.state != _COMPLETE:
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
