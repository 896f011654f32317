"""Flow control (featureGates: [flowControl]): queue requests instead of overloading the pool.

Dispatch order: strict priority across bands (higher first), round-robin across fairness ids
(`x-gateway-inference-fairness-id`) within a band, FCFS within a flow. Before each dispatch the saturation
detector is asked about the head request's candidates; while saturated, dispatch is held. Outcomes: dispatched →
proceed; over capacity → 429; TTL expired in the queue → 503; client gone → the queue slot is freed.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from epp.framework import (
    DeadlineOrdering,
    Endpoint,
    FairnessPolicy,
    FlowPicker,
    InferenceRequest,
    Plugin,
    PriorityCeilings,
    SaturationDetector,
    ServiceUnavailable,
    TooManyRequests,
    UsageLimitPolicy,
)
from epp.framework.errors import DROPPED_SATURATED, DROPPED_TTL_EXPIRED
from epp.framework.labels import FAIRNESS_LABELS, MODEL_LABELS
from epp.requestcontrol import flowcontrol_metrics as m
from epp.requestcontrol.eviction import Evictor
from epp.requestcontrol.flowcontrol_spec import DEFAULT_PRIORITY_BAND_MAX_BYTES, FlowControlSpec, PriorityBandSpec

log = logging.getLogger(__name__)


# deadline(request, enqueued, ttl) → an absolute deadline (monotonic seconds); earlier leaves first (EDF/SLO).
DeadlineFn = Callable[[InferenceRequest, float, float | None], float]
# pick_flow({fairness id: (queued, head enqueue time)}) → the flow to dispatch from (program-aware fairness).
PickFlowFn = Callable[[Mapping[str, tuple[int, float]]], str | None]
_SEQ = itertools.count()


@dataclass(eq=False, slots=True)
class _Item:
    request: InferenceRequest
    candidates: Sequence[Endpoint]
    size: int
    enqueued: float
    future: asyncio.Future[None]
    band: _Band
    done: bool = False
    dispatched: float = 0.0


class _FlowQueue:
    """One flow's queued items: FIFO (fcfs), or a heap by deadline then arrival (edf, slo-deadline)."""

    __slots__ = ("_deadline", "_fifo", "_heap")

    def __init__(self, deadline: DeadlineFn | None, ttl: float | None) -> None:
        self._deadline = (lambda r, t: deadline(r, t, ttl)) if deadline is not None else None
        self._fifo: deque[_Item] = deque()
        self._heap: list[tuple[float, float, int, _Item]] = []

    def append(self, item: _Item) -> None:
        if self._deadline is None:
            self._fifo.append(item)
        else:
            heapq.heappush(self._heap, (self._deadline(item.request, item.enqueued), item.enqueued, next(_SEQ), item))

    def head(self) -> _Item | None:
        """The next live item (finished items are dropped lazily)."""
        if self._deadline is None:
            while self._fifo and self._fifo[0].done:
                self._fifo.popleft()
            return self._fifo[0] if self._fifo else None
        while self._heap and self._heap[0][3].done:
            heapq.heappop(self._heap)
        return self._heap[0][3] if self._heap else None

    def pop(self) -> None:
        if self._deadline is None:
            self._fifo.popleft()
        else:
            heapq.heappop(self._heap)

    def __len__(self) -> int:
        return len(self._fifo) + len(self._heap)


@dataclass(eq=False)
class _Band:
    priority: int
    max_bytes: int | None
    max_requests: int | None
    strict: bool = False  # global-strict fairness: one FCFS order across the band's flows
    flows: OrderedDict[str, _FlowQueue] = field(default_factory=OrderedDict)
    count: int = 0
    bytes: int = 0
    deadline: DeadlineFn | None = None  # the ordering policy (None: FCFS)
    pick_flow: PickFlowFn | None = None  # the fairness policy's choice among flows (None: round-robin)
    ttl: float | None = None

    def add(self, item: _Item) -> None:
        q = self.flows.get(item.request.fairness_id)
        if q is None:
            q = self.flows[item.request.fairness_id] = _FlowQueue(self.deadline, self.ttl)
        q.append(item)

    def head(self) -> _Item | None:
        """The next item: round-robin over flows, the policy's flow, or the oldest head if strict."""
        heads: dict[str, _Item] = {}
        for fid in list(self.flows):
            h = self.flows[fid].head()
            if h is None:
                del self.flows[fid]
                continue
            if not self.strict and self.pick_flow is None:
                return h
            heads[fid] = h
        if not heads:
            return None
        if self.pick_flow is not None:
            chosen = self.pick_flow({f: (len(self.flows[f]), h.enqueued) for f, h in heads.items()})
            if chosen is not None and chosen in heads:
                return heads[chosen]
        return min(heads.values(), key=lambda it: it.enqueued)

    def pop_head(self, item: _Item) -> None:
        fid = item.request.fairness_id
        q = self.flows[fid]
        q.pop()
        if not len(q):
            del self.flows[fid]
        elif not self.strict:
            self.flows.move_to_end(fid)  # the next dispatch in this band goes to the next flow


class FlowController:
    def __init__(
        self,
        spec: FlowControlSpec,
        detector: SaturationDetector,
        pool_name: str = "default",
        *,
        plugins: Mapping[str, Plugin] | None = None,
        poll_interval: float = 0.005,
        evictor: Evictor | None = None,
    ) -> None:
        self.spec = spec
        self.detector = detector
        # Run before each saturation check: brings the in-flight counts the detector reads up to date (the
        # director's PreRequest records held back until an answer is written).
        self.settle: Callable[[], None] | None = None
        self._plugins = dict(plugins or {})
        limit = self._plugins.get(spec.usage_limit_policy_ref or "")
        # static-usage-limit-policy: dispatch while saturation < threshold (GIE default 1.0); priority-aware
        # policies give one ceiling per active priority (`ceilings(saturation, priorities highest first)`).
        self.threshold = limit.threshold if isinstance(limit, UsageLimitPolicy) else 1.0
        self._ceilings: Callable[[float, list[int]], list[float]] | None = (
            limit.ceilings if isinstance(limit, PriorityCeilings) else None
        )
        self.pool = pool_name
        self.poll_interval = poll_interval
        # flowControl.enableEviction: held dispatch revokes in-flight sheddable requests (epp.requestcontrol.eviction)
        self.evictor = evictor
        self._bands: dict[int, _Band] = {}
        self._order: list[int] = []  # band priorities, highest first
        self._templates = {b.priority: b for b in spec.priority_bands}
        self.count = 0
        self.bytes = 0
        self._task: asyncio.Task[None] | None = None

    def _band(self, priority: int) -> _Band:
        band = self._bands.get(priority)
        if band is None:
            spec = self.spec
            default = spec.default_negative_priority_band if priority < 0 else None
            t = self._templates.get(priority) or default or spec.default_priority_band or PriorityBandSpec(priority)
            max_bytes = t.max_bytes if t.max_bytes else DEFAULT_PRIORITY_BAND_MAX_BYTES
            fairness = self._plugins.get(t.fairness_policy_ref or "")
            strict = fairness.strict if isinstance(fairness, FairnessPolicy) else False
            ordering = self._plugins.get(t.ordering_policy_ref or "")
            band = self._bands[priority] = _Band(
                priority,
                max_bytes,
                t.max_requests,
                strict,
                deadline=ordering.deadline if isinstance(ordering, DeadlineOrdering) else None,
                pick_flow=fairness.pick_flow if isinstance(fairness, FlowPicker) else None,
                ttl=spec.default_request_ttl,
            )
            self._order = sorted(self._bands, reverse=True)
        return band

    def _labels(self, r: InferenceRequest) -> tuple[str, str, str, str, str]:
        ml = MODEL_LABELS.label
        return (FAIRNESS_LABELS.label(r.fairness_id), str(r.priority), self.pool, ml(r.model), ml(r.target_model))

    async def enqueue_and_wait(self, request: InferenceRequest, candidates: Sequence[Endpoint]) -> None:
        """Returns when the request may be scheduled; raises TooManyRequests / ServiceUnavailable otherwise."""
        if self.count == 0:
            sat = self.detector.saturation(candidates)
            m.FC_POOL_SATURATION.labels(self.pool).set(sat)
            if sat < self._ceiling(sat, request.priority):
                return  # nothing queued and capacity available: dispatch at once
        size = request.body_size
        band = self._band(request.priority)
        spec = self.spec
        if (
            (spec.max_requests is not None and self.count + 1 > spec.max_requests)
            or (spec.max_bytes is not None and self.bytes + size > spec.max_bytes)
            or (band.max_requests is not None and band.count + 1 > band.max_requests)
            or (band.max_bytes is not None and band.bytes + size > band.max_bytes)
        ):
            m.FC_QUEUE_DURATION.labels(*self._labels(request), "RejectedCapacity").observe(0)
            raise TooManyRequests("flow control queue is at capacity", dropped_reason=DROPPED_SATURATED)
        loop = asyncio.get_running_loop()
        item = _Item(request, candidates, size, time.monotonic(), loop.create_future(), band)
        band.add(item)
        self._account(item, +1)
        if self._task is None:
            self._task = loop.create_task(self._dispatch_loop(), name="flow-control dispatcher")
        outcome = "Dispatched"
        try:
            ttl = spec.default_request_ttl
            if ttl:
                async with asyncio.timeout(ttl):
                    await item.future
            else:
                await item.future
        except TimeoutError:
            outcome = "EvictedTTL"
            raise ServiceUnavailable("request timed out in queue", dropped_reason=DROPPED_TTL_EXPIRED) from None
        except asyncio.CancelledError:
            outcome = "EvictedContextCancelled"
            raise
        finally:
            if not item.done:
                item.done = True
                self._account(item, -1)
            m.FC_QUEUE_DURATION.labels(*self._labels(request), outcome).observe(time.monotonic() - item.enqueued)

    def _account(self, item: _Item, sign: int) -> None:
        self.count += sign
        self.bytes += sign * item.size
        item.band.count += sign
        item.band.bytes += sign * item.size
        labels = self._labels(item.request)
        m.FC_QUEUE_SIZE.labels(*labels).inc(sign)
        m.FC_QUEUE_BYTES.labels(*labels).inc(sign * item.size)

    def _head(self) -> _Item | None:
        for prio in self._order:
            item = self._bands[prio].head()
            if item is not None:
                return item
        return None

    def _ceiling(self, saturation: float, priority: int) -> float:
        """The dispatch ceiling of `priority` among the known priority levels (the usage limit policy's)."""
        if self._ceilings is None:
            return self.threshold
        # every priority level the registry knows (configured bands and those created so far), as llm-d does
        active = sorted(set(self._templates) | set(self._bands) | {priority}, reverse=True)
        try:
            return self._ceilings(saturation, active)[active.index(priority)]
        except Exception:
            log.exception("usage limit policy failed; using the static threshold")
            return self.threshold

    async def _dispatch_loop(self) -> None:
        try:
            while self.count > 0:
                item = self._head()
                if item is None:
                    break
                if self.settle is not None:
                    self.settle()
                sat = self.detector.saturation(item.candidates)
                m.FC_POOL_SATURATION.labels(self.pool).set(sat)
                ceiling = self._ceiling(sat, item.band.priority)
                if sat >= ceiling:
                    if self.evictor is not None:
                        self.evictor.reclaim(sat, ceiling, item.band.priority)
                    await asyncio.sleep(self.poll_interval)  # held: wait for fresher metrics
                    continue
                item.band.pop_head(item)
                item.done = True
                self._account(item, -1)
                if not item.future.done():
                    item.future.set_result(None)
                await asyncio.sleep(0)
        finally:
            self._task = None

    def queued(self) -> int:
        return self.count
