"""What every stream shares (`ServerState`) and what one stream holds (`StreamState`, the base of the stages)."""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2

from epp.framework.context import EndpointView
from epp.framework.errors import DROPPED_NO_ENDPOINTS, ServiceUnavailable
from epp.framework.keys import DESTINATION_HEADER, REQUEST_ID_HEADER
from epp.framework.parsing import NoParser, ParserRegistry, request_path
from epp.framework.types import InferenceRequest
from epp.protocol.rewrite import ModelNameRewriter
from epp.protocol.usage import SSEUsageReader
from epp.requestcontrol.types import Director, RoutingDecision, locate_candidates
from epp.server.memtrim import MemoryTrimmer
from epp.server.metrics import RequestMetrics
from epp.wiring.builtins import default_parsers

_Mode = processing_mode_pb2.ProcessingMode
FULL_DUPLEX = _Mode.FULL_DUPLEX_STREAMED
BUFFERED = _Mode.BUFFERED

DEFAULT_MAX_BODY_BYTES = 128 * 1024 * 1024  # a gathered request body beyond this is refused with 413
# All request bodies being gathered at once, across streams: past it a body is refused with 503 (parsing multiplies
# a body several times over, so this bounds the EPP's peak memory, not just the raw bytes).
DEFAULT_MAX_INFLIGHT_BODY_BYTES = 256 * 1024 * 1024
# A request body not complete this long after its headers: 408, and the stream (and what it holds) ends. Envoy's
# own idle timeouts (300 s) would hold it ~20 KB a stream meanwhile.
DEFAULT_BODY_TIMEOUT = 30.0

# Request states, as in GIE's handlers/server.go.
RECEIVED, HEADERS_DONE, BODY_DONE, RESPONSE, RESPONSE_HEADERS_DONE, COMPLETE = range(6)


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


class StreamState:
    """The state of one HTTP request as seen over one ext_proc stream; each stage below extends it."""

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
        self.state = RECEIVED
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

    def _request_id(self) -> str:
        if self.request is not None:
            return self.request.request_id
        return self.headers.get(REQUEST_ID_HEADER, "?")

    def _format(self) -> str:
        """The error shape of the request's API: its parser's, also before the body is parsed (a 413 or 503 while
        gathering it), so an Anthropic client gets Anthropic's shape; OpenAI's when no parser claims the path."""
        if not self._error_format:
            try:
                self._error_format = self.s.parsers.resolve(request_path(self.headers)).error_format
            except NoParser:
                self._error_format = "openai"
        return self._error_format

    def _end_span(self, error: str | None = None) -> None:
        span, self._span = self._span, None
        req, decision = self.request, self.decision
        attributes = {
            "gen_ai.request.model": req.model if req is not None else None,
            "gen_ai.request.target_model": req.target_model if req is not None else None,
            REQUEST_ID_HEADER: self.headers.get(REQUEST_ID_HEADER),
            DESTINATION_HEADER: decision.destination if decision is not None else None,
            "http.response.status_code": self.status or None,
        }
        self.s.tracing.finish(span, attributes, error)
