"""The one owner of work the director holds back from the answer path: the `records_only` PreRequest hooks of
picks whose answer is still being written. The servicer runs them once the answer is written; the director runs
them first whenever anything else reaches it (the next request's admission, producers and scheduling, a response
hook, flow control's dispatcher), so every booking is made before anything reads it."""

from __future__ import annotations

import logging
from collections.abc import Callable

from epp.framework import EndpointView, InferenceRequest, PreRequest, SchedulingResult

log = logging.getLogger("epp.requestcontrol.director")


class DeferredRecords:
    __slots__ = ("_hooks", "_run_hooks", "_view", "pending")

    def __init__(
        self,
        view: EndpointView,
        hooks: list[PreRequest],
        run_hooks: Callable[[list[PreRequest], InferenceRequest, SchedulingResult], None],
    ) -> None:
        self._view = view
        self._hooks = hooks
        self._run_hooks = run_hooks
        self.pending: list[tuple[InferenceRequest, SchedulingResult]] = []  # picks whose records wait

    def hold(self, request: InferenceRequest, result: SchedulingResult) -> None:
        self.pending.append((request, result))

    def run(self) -> None:
        """The held-back hooks, in pick order. A pick one of whose endpoints (any profile's: a P/D prefill pod too)
        left the pool while its answer was written is not booked: the plugins already dropped that endpoint's
        state, and a booking now would bring it back for an endpoint that is gone."""
        pending = self.pending
        if pending:
            self.pending = []
            get = self._view.get
            for request, result in pending:
                if any(
                    get(ep.name) is None
                    for pr in result.profile_results.values()
                    if pr is not None
                    for ep in pr.targets
                ):
                    log.debug("request %s: its endpoint left the pool before its records ran", request.request_id)
                    continue
                self._run_hooks(self._hooks, request, result)
