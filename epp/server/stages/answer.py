"""Answer: what goes back to Envoy for the request. Errors become an ImmediateResponse in the API's own shape; a
decision becomes the destination header (OVERWRITE: a client-sent one never survives), the prefiller/encoder
headers (ours or none), content-length, clear_route_cache and the `envoy.lb` dynamic metadata, then the body."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable, Iterator
from typing import Any

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.type.v3 import http_status_pb2

from epp.framework.errors import DROPPED_REASON_HEADER, RequestError
from epp.framework.keys import DESTINATION_HEADER, DISAGG_HEADERS
from epp.server.stages.decide import Decide
from epp.server.stages.state import BUFFERED, COMPLETE

log = logging.getLogger("epp.server.extproc")

DESTINATION_NAMESPACE = "envoy.lb"
SCORES_KEY = "x-gateway-destination-endpoint-scores"  # envoy.lb metadata with --emit-endpoint-scores
BODY_CHUNK_LIMIT = 62_000  # GIE's BodyByteLimit: Envoy takes at most 64 KiB per streamed chunk
ROUTING_WIRE_CACHE = 4096  # destinations whose routing answer is kept serialized (cleared when full)

OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
_JSON_CT = base_pb2.HeaderValueOption(
    header=base_pb2.HeaderValue(key="content-type", raw_value=b"application/json"), append_action=OVERWRITE
)
# gRPC status codes for the HTTP statuses the EPP answers with (gRPC APIs get a gRPC error, not a JSON body).
_GRPC_STATUS = {400: 3, 404: 12, 413: 8, 429: 8, 500: 13, 503: 14}


def set_header(key: str, value: str) -> base_pb2.HeaderValueOption:
    return base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key=key, raw_value=value.encode()), append_action=OVERWRITE
    )


def immediate(err: RequestError, error_format: str = "openai") -> pb.ProcessingResponse:
    """An ImmediateResponse in the API's error shape: OpenAI-style JSON, Anthropic's JSON, or a gRPC status."""
    dropped = [set_header(DROPPED_REASON_HEADER, err.dropped_reason)] if err.dropped_reason else []
    if error_format == "grpc":
        return pb.ProcessingResponse(
            immediate_response=pb.ImmediateResponse(
                status=http_status_pb2.HttpStatus(code=err.status),
                headers=pb.HeaderMutation(set_headers=dropped, remove_headers=[DESTINATION_HEADER]),
                grpc_status=pb.GrpcStatus(status=_GRPC_STATUS.get(err.status, 2)),
                body=err.message.encode(),
                details=f"epp_{err.code}",
            )
        )
    return pb.ProcessingResponse(
        immediate_response=pb.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=err.status),
            headers=pb.HeaderMutation(set_headers=[_JSON_CT, *dropped], remove_headers=[DESTINATION_HEADER]),
            body=err.body(error_format),
            details=f"epp_{err.code}",
        )
    )


def split_chunks(parts: list[bytes], limit: int = BODY_CHUNK_LIMIT) -> list[bytes]:
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


# BUFFERED mode answers the headers before the decision: any client-sent destination or prefiller header goes.
_STRIP_CLIENT_ROUTING = pb.CommonResponse(
    header_mutation=pb.HeaderMutation(remove_headers=[DESTINATION_HEADER, *DISAGG_HEADERS])
)


class Answer(Decide):
    __slots__ = ()

    def _reject(self, err: RequestError) -> pb.ProcessingResponse:
        if self._span is not None:
            self._end_span(f"{err.status} {err.code}")
        req = self.request
        level = logging.WARNING if err.status >= 500 else logging.INFO
        log.log(level, "request %s rejected with %d: %s", self._request_id(), err.status, err.message)
        if req is not None and req.model:
            self.s.metrics.request_error(req.model, req.target_model, err.code)
        self.state = COMPLETE
        return immediate(err, self._format())

    @staticmethod
    def _strip_client_routing() -> pb.ProcessingResponse:
        return pb.ProcessingResponse(request_headers=pb.HeadersResponse(response=_STRIP_CLIENT_ROUTING))

    def _answer_decision(self, forward: bytes, rewritten: bool, end_of_stream: bool) -> Iterable[pb.ProcessingResponse]:
        """The answer to a decided body: in BUFFERED mode one body response carrying the routing; otherwise the
        held headers' answer, then the body streamed back (a large one made piece by piece as it is written)."""
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
            opt.append_action = OVERWRITE
        return resp

    def _routing_common(self, content_length: int | None) -> pb.CommonResponse:
        """The header mutation (and the dynamic metadata, set by the caller's response) for the decision."""
        assert self.decision is not None
        destination = self.decision.destination
        set_headers = [set_header(DESTINATION_HEADER, destination)]
        if content_length is not None:
            set_headers.append(set_header("content-length", str(content_length)))
        for k, v in self.decision.headers.items():
            set_headers.append(set_header(k, v))
        if self._span is not None:  # the trace continues upstream
            for k, v in self.s.tracing.inject(self._span).items():
                set_headers.append(set_header(k, v))
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
        lb[DESTINATION_HEADER] = self.decision.destination
        result = self.decision.result
        if self.s.emit_endpoint_scores and result is not None:
            primary = result.profile_results.get(result.primary_profile)
            if primary is not None and primary.candidates:
                lb[SCORES_KEY] = {ep.hostport: score for ep, score in primary.candidates}
        return {DESTINATION_NAMESPACE: lb}
