"""Flow-control eviction (llm-d-router `flowControl.enableEviction`): when dispatch is held by saturation and a
higher-priority request waits, in-flight sheddable requests are revoked so their capacity comes back.

The director tracks every dispatched request here with an event; evicting one sets it, and the ext_proc stream
answers Envoy with an ImmediateResponse (429), which resets the upstream request so the model server frees its KV.
Victims pass the filter (sheddable: priority < 0, and below the waiting request's priority) and are taken in the
ordering's order (lowest priority, then newest dispatch). As llm-d's reclamation controller: each decision revokes
ceil((saturation - ceiling - pending) / (saturation / in-flight)) requests (at most MAX_PER_DECISION), then no more
until every revoked request has ended (or CONFIRM_TIMEOUT passed) and `grace` has elapsed for the freed capacity to
show in the saturation signal.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from epp.framework.verbosity import DEFAULT, V

log = logging.getLogger(__name__)

MAX_PER_DECISION = 8
CONFIRM_TIMEOUT = 5.0


@dataclass(eq=False, slots=True)
class InFlight:
    request_id: str
    priority: int
    dispatched: float
    event: asyncio.Event = field(default_factory=asyncio.Event)


class Evictor:
    def __init__(
        self,
        eligible: Callable[[int], bool],
        victim_key: Callable[[int, float], tuple[int, float]],
        grace: float = 0.0,
    ) -> None:
        self.eligible, self.victim_key, self.grace = eligible, victim_key, grace
        # Keyed by each request's event, not its id: x-request-id is the client's, and two requests may share it.
        self._inflight: dict[asyncio.Event, InFlight] = {}
        self._outstanding: dict[asyncio.Event, tuple[float, float]] = {}  # event → (credit, issued at)
        self._cooling: list[tuple[float, float]] = []  # (credit, until)
        self.evicted_total = 0

    def track(self, request_id: str, priority: int) -> asyncio.Event:
        """A request dispatched: the event is set if it is evicted, and is the handle `untrack` takes."""
        item = InFlight(request_id, priority, time.monotonic())
        self._inflight[item.event] = item
        return item.event

    def untrack(self, event: asyncio.Event) -> None:
        """The request `track` gave `event` ended (served, failed or evicted): confirms a revocation."""
        self._inflight.pop(event, None)
        rev = self._outstanding.pop(event, None)
        if rev is not None:
            self._cooling.append((rev[0], time.monotonic() + self.grace))

    @property
    def pending(self) -> float:
        return sum(c for c, _ in self._outstanding.values()) + sum(c for c, _ in self._cooling)

    def gate_open(self, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        for event, (_, issued) in list(self._outstanding.items()):
            if now - issued >= CONFIRM_TIMEOUT:  # never confirmed: give up on it
                del self._outstanding[event]
        self._cooling = [(c, until) for c, until in self._cooling if until > now]
        return not self._outstanding and not self._cooling

    def reclaim(self, saturation: float, ceiling: float, demand_priority: int) -> list[str]:
        """Revoke in-flight requests for a request of `demand_priority` held at `saturation` over `ceiling`."""
        if not self.gate_open():
            return []
        inflight = len(self._inflight)
        victims = sorted(
            (
                it
                for it in self._inflight.values()
                if not it.event.is_set() and it.priority < demand_priority and self.eligible(it.priority)
            ),
            key=lambda it: self.victim_key(it.priority, it.dispatched),
        )
        if inflight == 0 or not victims or saturation <= 0:
            return []
        credit = saturation / inflight
        target = saturation - ceiling - self.pending
        if target < 0:
            return []
        n = min(max(1, math.ceil(target / credit)), MAX_PER_DECISION, len(victims))
        now = time.monotonic()
        out = []
        for it in victims[:n]:
            it.event.set()
            self._outstanding[it.event] = (credit, now)
            out.append(it.request_id)
        self.evicted_total += len(out)
        log.log(
            V(DEFAULT),
            "flow control evicted %d in-flight request(s) for priority %d: %s",
            len(out),
            demand_priority,
            out,
        )
        return out
