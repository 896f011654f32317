"""The Director: objective → priority, admission, candidates, data producers, scheduling, hooks.

Order follows GIE's director: the protocol layer has already applied model rewrites; then priority from the
InferenceObjective named by `x-gateway-inference-objective`; candidates (subset hint; none → 503); admission
(legacy: sheddable + saturated → 429; or the flow-control queue); DataProducers within one 400 ms budget (a
failure never fails the request); Admitters (a deny reason → 429, as a shed); Schedule (failure → 429);
PreRequest hooks; ResponseStreaming hooks see every response body chunk. The response hooks get the
endpoint that served the request (Envoy's `-served` metadata, else the pick).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Generator, Mapping
from typing import Any

from epp.datalayer.health import healthy_candidates, response_status
from epp.datalayer.objectives import ObjectiveStore
from epp.framework import (
    RESPONSE_STATUS,
    UPSTREAM_HEADERS,
    AdmissionScope,
    DataProducer,
    Endpoint,
    EndpointView,
    InferenceRequest,
    PreRequest,
    Response,
    ResponseChunk,
    SchedulingResult,
    ServiceUnavailable,
    TooManyRequests,
    Usage,
)
from epp.framework.attributes import AGENT_ID
from epp.framework.errors import DROPPED_NO_ENDPOINTS, DROPPED_SATURATED
from epp.framework.keys import FAIRNESS_HEADER, LLMD_FAIRNESS_HEADER, OBJECTIVE_HEADER
from epp.framework.labels import MODEL_LABELS
from epp.framework.logthrottle import LogThrottle
from epp.requestcontrol.deferred import DeferredRecords
from epp.requestcontrol.flowcontrol import FlowController
from epp.requestcontrol.pipeline import Pipeline
from epp.requestcontrol.types import RoutingDecision, locate_candidates
from epp.scheduling import SchedulingFailed
from epp.scheduling.metrics import SCHEDULER_ATTEMPTS

log = logging.getLogger(__name__)
_throttle = LogThrottle()

PRODUCER_BUDGET_SECONDS = 0.4
NO_ENDPOINT_POLL = 0.05
ATTEMPT_CHILDREN_CACHE = 4096  # (model, endpoint) pairs whose scheduler-attempts child is kept (cleared when full)


class _Resumed:
    """Awaiting the rest of a coroutine already stepped once by hand, which yielded `pending` to its task: what
    `yield from` does, from its second step on (values and exceptions passed both ways)."""

    __slots__ = ("coro", "pending")

    def __init__(self, coro: Any, pending: Any) -> None:
        self.coro = coro
        self.pending = pending

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, value = self.coro, self.pending
        self.pending = None
        while True:
            try:
                sent = yield value
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as e:  # a cancellation (the budget's timeout) or anything thrown into the task
                try:
                    value = coro.throw(e)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    value = coro.send(sent)
                except StopIteration as stop:
                    return stop.value


class SchedulingDirector:
    def __init__(
        self,
        endpoints: EndpointView,
        pipeline: Pipeline,
        objectives: ObjectiveStore | None = None,
        *,
        flow_controller: FlowController | None = None,
        producer_budget: float = PRODUCER_BUDGET_SECONDS,
    ) -> None:
        self.view = endpoints
        self.pipeline = pipeline
        self.scheduler = pipeline.scheduler
        self.detector = pipeline.saturation_detector
        self.objectives = objectives or ObjectiveStore()
        self.flow_controller = flow_controller
        self.producer_budget = producer_budget
        self._producers = list(pipeline.producers)
        # A producer that waits on purpose (burst-prefix-cache-producer's window) extends the budget to its own.
        self.producer_budget = max([producer_budget, *(p.produce_timeout for p in self._producers)])
        # PreRequest hooks that only record the pick (`records_only`) may run after the answer is written.
        self._pre_request = [h for h in pipeline.pre_request if not h.records_only]
        self._records = [h for h in pipeline.pre_request if h.records_only]
        self._deferred = DeferredRecords(self.view, self._records, self._run_pre_request)
        if flow_controller is not None:  # its dispatcher checks saturation between picks: records first
            flow_controller.settle = self._deferred.run
        self._received = list(pipeline.response_received)
        self._complete = list(pipeline.response_complete)
        # A ResponseComplete hook that answers with dynamic metadata (request-attribute-reporter) must run before
        # the last body message is answered; without one, completion can wait until that answer is written.
        self.completes_before_last_answer = any(h.writes_response_metadata for h in self._complete)
        self._streaming = list(pipeline.response_streaming)
        self._header_processors = list(pipeline.header_processors)
        self._screeners = list(pipeline.screeners)
        handler = self.scheduler.handler
        self._admission_scope = handler if isinstance(handler, AdmissionScope) else None
        self._admitters = list(pipeline.admitters)
        self._attempt_children: dict[tuple[str, str, str, int], Any] = {}

    def _attempt_success(self, model: str, primary: Endpoint) -> Any:
        """The success child of the scheduler-attempts counter for (model label, endpoint), kept per pair:
        `labels()` takes a lock and builds the label tuple on every call."""
        key = (model, primary.pod_name, primary.namespace, primary.port)
        child = self._attempt_children.get(key)
        if child is None:
            if len(self._attempt_children) >= ATTEMPT_CHILDREN_CACHE:
                self._attempt_children.clear()
            child = SCHEDULER_ATTEMPTS.labels("success", model, primary.pod_name, primary.namespace, str(primary.port))
            self._attempt_children[key] = child
        return child

    async def handle_request(self, request: InferenceRequest, *, defer_records: bool = False) -> RoutingDecision:
        """Admit, prepare, schedule and run the PreRequest hooks. With `defer_records` (the servicer, which calls
        `run_deferred` once the answer is written) the `records_only` hooks wait until then, or until the next
        request or response hook reaches the director, whichever comes first."""
        if self._deferred.pending:
            self._deferred.run()
        headers = request.headers
        if request.objective is None:
            request.objective = headers.get(OBJECTIVE_HEADER) or None
        request.priority = self.objectives.priority(request.objective)
        for proc in self._header_processors:
            try:
                proc.process_request_headers(request)
            except Exception:
                log.exception("request header processor %s failed for request %s", proc.name, request.request_id)
        # the fairness id: the explicit header wins, else the agent identity (agent-identity), else the default
        fid = headers.get(LLMD_FAIRNESS_HEADER) or headers.get(FAIRNESS_HEADER) or request.data.get(AGENT_ID)
        if fid:
            request.fairness_id = fid

        candidates = healthy_candidates(locate_candidates(self.view.endpoints(), request.subset))
        fc = self.flow_controller
        if not candidates and fc is not None and fc.spec.no_endpoint_request_ttl:
            candidates = await self._await_candidates(request, fc.spec.no_endpoint_request_ttl)
        if not candidates:
            raise ServiceUnavailable(
                "failed to find candidate endpoints for serving the request", dropped_reason=DROPPED_NO_ENDPOINTS
            )
        for screener in self._screeners:  # a screener raises ServiceUnavailable to fail closed
            candidates = list(screener.screen(request, candidates))
            if not candidates:
                raise ServiceUnavailable(
                    f"no candidate endpoints left after {screener.name}", dropped_reason=DROPPED_NO_ENDPOINTS
                )

        # Stage-aware: saturation over the pods every request needs (P/D: decode pods, not the prefill pool).
        admitted = candidates if self._admission_scope is None else self._admission_endpoints(request, candidates)
        if self.flow_controller is not None:
            await self.flow_controller.enqueue_and_wait(request, admitted)
        elif request.sheddable and self.detector.saturation(admitted) >= 1.0:
            raise TooManyRequests("system saturated, sheddable request dropped", dropped_reason=DROPPED_SATURATED)

        if self._producers:
            await self._prepare(request, candidates)

        for admitter in self._admitters:
            try:
                reason = admitter.admit(request, candidates)
            except Exception:
                log.exception("Admitter %s failed for request %s; admitting", admitter.name, request.request_id)
                continue
            if reason is not None:
                raise TooManyRequests(f"request cannot be admitted: {reason}")

        if self._deferred.pending:  # a producer suspended, and other picks came through meanwhile
            self._deferred.run()
        try:
            result = self.scheduler.schedule(request, candidates)
        except SchedulingFailed as e:
            SCHEDULER_ATTEMPTS.labels("failure", MODEL_LABELS.label(request.target_model), "", "", "").inc()
            raise TooManyRequests(f"failed to find target endpoint: {e}", dropped_reason=DROPPED_SATURATED) from None
        primary = result.targets[0]
        self._attempt_success(MODEL_LABELS.label(request.target_model), primary).inc()
        self._run_pre_request(self._pre_request, request, result)
        if self._records:
            if defer_records:
                self._deferred.hold(request, result)
            else:
                self._run_pre_request(self._records, request, result)
        headers_out = request.data.get(UPSTREAM_HEADERS)
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "request %s model %s priority %d → %s",
                request.request_id,
                request.target_model,
                request.priority,
                ",".join(ep.hostport for ep in result.targets),
            )
        decision = RoutingDecision(endpoints=list(result.targets), result=result)
        evictor = self.flow_controller.evictor if self.flow_controller is not None else None
        if evictor is not None:
            decision.evicted = evictor.track(request.request_id, request.priority)
        if headers_out:
            decision.headers.update(headers_out)
        return decision

    @staticmethod
    def _run_pre_request(hooks: list[PreRequest], request: InferenceRequest, result: SchedulingResult) -> None:
        for hook in hooks:
            try:
                hook.pre_request(request, result)
            except Exception:
                log.exception("PreRequest plugin %s failed for request %s", hook.name, request.request_id)

    def run_deferred(self) -> None:
        """The `records_only` PreRequest hooks held back from the answer path (`DeferredRecords.run`)."""
        self._deferred.run()

    async def _await_candidates(self, request: InferenceRequest, ttl: float) -> list[Endpoint]:
        """flowControl.noEndpointRequestTTL: with no endpoint for it yet, a request waits up to `ttl` for one."""
        deadline = time.monotonic() + ttl
        while time.monotonic() < deadline:
            await asyncio.sleep(min(NO_ENDPOINT_POLL, max(0.0, deadline - time.monotonic())))
            candidates = healthy_candidates(locate_candidates(self.view.endpoints(), request.subset))
            if candidates:
                return candidates
        return []

    def _admission_endpoints(self, request: InferenceRequest, candidates: list[Endpoint]) -> list[Endpoint]:
        assert self._admission_scope is not None
        try:
            scoped = list(self._admission_scope.admission_endpoints(request, candidates))
        except Exception:
            log.exception("admission scope of %s failed; admitting over every candidate", self._admission_scope.name)
            return candidates
        return scoped or candidates

    async def _prepare(self, request: InferenceRequest, candidates: list[Endpoint]) -> None:
        """Run DataProducers in dependency order (the builder's) within one budget.

        A producer that finishes without suspending (a tokenizer-cache hit, an in-memory index lookup) runs as a
        plain call: the budget's timer is armed, at the deadline it would have had, only once a producer suspends.
        A timeout can take effect only at a suspension anyway, so requests whose producers never suspend pay for no
        timer."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.producer_budget
        producers = self._producers
        for i, producer in enumerate(producers):
            coro = producer.prepare(request, candidates)
            try:
                pending = coro.send(None)
            except StopIteration:
                continue
            except Exception:
                self._producer_failed(producer, request)
                continue
            await self._prepare_timed(request, candidates, deadline, i, _Resumed(coro, pending))
            return

    async def _prepare_timed(
        self,
        request: InferenceRequest,
        candidates: list[Endpoint],
        deadline: float,
        first: int,
        resumed: _Resumed,
    ) -> None:
        """The rest of `_prepare` once producer `first` has suspended (`resumed` finishes it): under the budget."""
        producers = self._producers
        current = producers[first].name
        try:
            async with asyncio.timeout_at(deadline):
                try:
                    await resumed
                except Exception:
                    self._producer_failed(producers[first], request)
                for producer in producers[first + 1 :]:
                    current = producer.name
                    if self._deferred.pending:  # picks made while this request waited: their records first
                        self._deferred.run()
                    try:
                        await producer.prepare(request, candidates)
                    except Exception:
                        self._producer_failed(producer, request)
        except TimeoutError:
            log.warning(
                "data producers exceeded the %.0f ms budget (at %s) for request %s; scheduling without their data",
                self.producer_budget * 1000,
                current,
                request.request_id,
            )

    @staticmethod
    def _producer_failed(producer: DataProducer, request: InferenceRequest) -> None:
        # Bad input (out-of-range token ids, lone surrogates) fails the same way for every such request: one
        # traceback per producer and error type every 5 s, not one per request. (Called inside the except block.)
        exc = sys.exc_info()[1]
        _throttle.log(
            log, logging.ERROR, f"{producer.name}:{type(exc).__name__}",
            "DataProducer %s failed for request %s: %s", producer.name, request.request_id,
            type(exc).__name__, exc_info=True,
        )  # fmt: skip

    @staticmethod
    def _endpoint_for(decision: RoutingDecision | None) -> Endpoint | None:
        if decision is None:
            return None
        if decision.served is not None:
            return decision.served
        return decision.endpoints[0] if decision.endpoints else None

    def handle_response_headers(
        self,
        request: InferenceRequest,
        decision: RoutingDecision,
        status: int,
        served: str | None,
        headers: Mapping[str, str],
    ) -> None:
        if self._deferred.pending:
            self._deferred.run()
        request.data.put(RESPONSE_STATUS, status)
        if served:
            endpoint = self.view.get_by_hostport(served)
            if endpoint is None:
                endpoint = next((ep for ep in decision.endpoints if ep.hostport == served), None)
            decision.served = endpoint
        endpoint = self._endpoint_for(decision)
        if endpoint is not None:
            response_status(endpoint, status, time.monotonic())
        if not self._received:
            return
        response = Response(status=status, headers=dict(headers))
        for hook in self._received:
            try:
                hook.response_received(request, response, endpoint)
            except Exception:
                log.exception("ResponseReceived plugin %s failed for request %s", hook.name, request.request_id)
        decision.response_headers.update(response.set_headers)

    def handle_response_chunk(
        self, request: InferenceRequest, decision: RoutingDecision | None, data: bytes, first: bool, end: bool
    ) -> None:
        if not self._streaming:
            return
        if self._deferred.pending:
            self._deferred.run()
        endpoint = self._endpoint_for(decision)
        chunk = ResponseChunk(data, first, end, time.monotonic())
        for hook in self._streaming:
            try:
                hook.response_chunk(request, chunk, endpoint)
            except Exception:
                log.exception("ResponseStreaming plugin %s failed for request %s", hook.name, request.request_id)

    def handle_response_complete(
        self, request: InferenceRequest, decision: RoutingDecision | None, usage: Usage | None
    ) -> None:
        if self._deferred.pending:
            self._deferred.run()
        evictor = self.flow_controller.evictor if self.flow_controller is not None else None
        if evictor is not None and decision is not None and decision.evicted is not None:
            evictor.untrack(decision.evicted)
        endpoint = self._endpoint_for(decision)
        for hook in self._complete:
            try:
                hook.response_complete(request, endpoint, usage)
            except Exception:
                log.exception("ResponseComplete plugin %s failed for request %s", hook.name, request.request_id)
