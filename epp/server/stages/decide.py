"""Decide: the director admits and schedules the parsed request (under the trace's orchestration span)."""

from __future__ import annotations

from epp.framework.errors import DROPPED_NO_ENDPOINTS, ServiceUnavailable
from epp.framework.parsing import ParsedRequest
from epp.framework.types import InferenceRequest
from epp.protocol.openai import bodyless_request
from epp.protocol.rewrite import ModelNameRewriter
from epp.requestcontrol.types import RoutingDecision
from epp.server.stages.parse import Parse
from epp.server.stages.state import BODY_DONE


class Decide(Parse):
    __slots__ = ()

    async def _decide(self, parsed: ParsedRequest, request: InferenceRequest, forward_bytes: int) -> RoutingDecision:
        """The director's decision for the request; from here on the director must see its completion."""
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
        self.state = BODY_DONE
        self.s.metrics.request_started(request.model, request.target_model, request.priority, forward_bytes)
        if request.target_model != request.model:
            self._rewriter = ModelNameRewriter(request.target_model, request.model)
        return decision

    def _decide_bodyless(self) -> RoutingDecision:
        """No body will come before the headers must be answered: route without scheduling."""
        self.request = bodyless_request(self.headers)
        self.request.subset = self.subset
        self.decision = self.s.pick_bodyless(self.subset)
        self.state = BODY_DONE
        return self.decision
