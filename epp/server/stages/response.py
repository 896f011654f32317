"""Response: status and content type from the headers, the body passed back (model name rewritten back to the
client's; the upstream content-length dropped, and in BUFFERED mode set to the rewritten body's length), usage read
from JSON or SSE, flow control's eviction, and completion: `complete` runs exactly once, also when the stream dies
early, and closes the trace."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from epp.framework.attributes import RESPONSE_METADATA
from epp.framework.errors import DROPPED_EVICTED, TooManyRequests
from epp.framework.types import Usage
from epp.framework.verbosity import VERBOSE, V
from epp.protocol.usage import MAX_JSON_USAGE_BYTES, SSEUsageReader, usage_from_json
from epp.server.memtrim import TRIM_AFTER_BODY_BYTES
from epp.server.stages.answer import (
    BODY_CHUNK_LIMIT,
    DESTINATION_NAMESPACE,
    Answer,
    immediate,
    set_header,
    split_chunks,
)
from epp.server.stages.receive import headers_of
from epp.server.stages.state import BUFFERED, COMPLETE, FULL_DUPLEX, RESPONSE_HEADERS_DONE

log = logging.getLogger("epp.server.extproc")

SERVED_METADATA_KEY = "x-gateway-destination-endpoint-served"  # envoy.lb metadata: the endpoint that served
_RESPONSE_HEADERS_PASS = pb.ProcessingResponse(response_headers=pb.HeadersResponse())


def served_endpoint(md: base_pb2.Metadata) -> str | None:
    fm = md.filter_metadata
    if DESTINATION_NAMESPACE in fm:
        fields = fm[DESTINATION_NAMESPACE].fields
        if SERVED_METADATA_KEY in fields:
            return fields[SERVED_METADATA_KEY].string_value or None
    return None


class Respond(Answer):
    __slots__ = ()

    def _response_headers(self, msg: pb.ProcessingRequest) -> list[pb.ProcessingResponse]:
        headers = headers_of(msg.response_headers)
        try:
            self.status = int(headers.get(":status", "0"))
        except ValueError:
            self.status = 0
        self.state = RESPONSE_HEADERS_DONE
        req = self.request
        if req is not None and self.model_routed:
            if not 200 <= self.status < 300:
                self.s.metrics.request_error(req.model, req.target_model, "ModelServerError")
            served = served_endpoint(msg.metadata_context) if msg.HasField("metadata_context") else None
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
        set_headers = [set_header(k, str(v)) for k, v in extra.items()] if extra else []
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
            pieces = split_chunks([out_chunk])
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
            common.header_mutation.set_headers.append(set_header("content-length", str(len(out_chunk))))
        resp = pb.ProcessingResponse(response_body=pb.BodyResponse(response=common))
        if reported:
            resp.dynamic_metadata.update(reported)
        return [resp]

    @property
    def eviction(self) -> asyncio.Event | None:
        """The decision's eviction event while the response is still under way (flowControl.enableEviction)."""
        d = self.decision
        return d.evicted if d is not None and self.state != COMPLETE else None

    def evict(self) -> pb.ProcessingResponse:
        """Flow control revoked this in-flight request: end it with a 429 (the director hears completion)."""
        log.log(V(VERBOSE), "request %s evicted by flow control", self.request.request_id if self.request else "?")
        self.complete()
        evicted = TooManyRequests("request evicted by flow control", dropped_reason=DROPPED_EVICTED)
        return immediate(evicted, self._format())

    def complete(self) -> None:
        """Record usage and tell the director, exactly once per routed request (also on early stream end)."""
        self._release_body()
        if self._body_size >= TRIM_AFTER_BODY_BYTES:
            self._body_size = 0
            self.s.trimmer.request()
        self.state = COMPLETE
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
