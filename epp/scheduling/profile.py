"""One scheduling profile: filters narrow the candidates, weighted scorers rank them, the picker chooses."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from epp.framework import CycleState, Endpoint, Filter, InferenceRequest, Picker, ProfileResult, Scorer

log = logging.getLogger(__name__)

# Called with (extension_point, plugin, seconds) when a cycle is sampled for per-plugin timing.
PluginTimer = Callable[[str, object, float], None]


@dataclass(slots=True)
class WeightedScorer:
    scorer: Scorer
    weight: float


class SchedulerProfile:
    """GIE's SchedulerProfile: total(e) = Σ clamp(score_s(e), 0, 1) x weight_s (not normalized)."""

    def __init__(self, name: str, filters: Sequence[Filter], scorers: Sequence[WeightedScorer], picker: Picker) -> None:
        self.name = name
        self.filters = list(filters)
        self.scorers = list(scorers)
        self.picker = picker
        # Precomputed (scorer, weight) pairs so the hot loop does no attribute lookups.
        self._pairs = [(ws.scorer, float(ws.weight)) for ws in self.scorers]

    def run(
        self,
        state: CycleState,
        request: InferenceRequest,
        candidates: Sequence[Endpoint],
        timer: PluginTimer | None = None,
    ) -> ProfileResult | None:
        """Returns None when the filters leave no endpoint ("no endpoints available")."""
        endpoints: Sequence[Endpoint] = candidates
        for f in self.filters:
            if timer is None:
                endpoints = f.filter(state, request, endpoints)
            else:
                t0 = time.perf_counter()
                endpoints = f.filter(state, request, endpoints)
                timer("Filter", f, time.perf_counter() - t0)
            if not endpoints:
                if log.isEnabledFor(logging.DEBUG):
                    log.debug("profile %s: filter %s left no endpoints", self.name, f.name)
                return None
        n = len(endpoints)
        totals = [0.0] * n
        for scorer, weight in self._pairs:
            if timer is None:
                scores = scorer.score(state, request, endpoints)
            else:
                t0 = time.perf_counter()
                scores = scorer.score(state, request, endpoints)
                timer("Scorer", scorer, time.perf_counter() - t0)
            if len(scores) != n:
                raise ValueError(f"scorer {scorer.name} returned {len(scores)} scores for {n} endpoints")
            totals = [
                t + (0.0 if s <= 0.0 else weight if s >= 1.0 else s * weight)
                for t, s in zip(totals, scores, strict=True)
            ]
        scored = list(zip(endpoints, totals, strict=True))
        if timer is None:
            result = self.picker.pick(state, request, scored)
        else:
            t0 = time.perf_counter()
            result = self.picker.pick(state, request, scored)
            timer("Picker", self.picker, time.perf_counter() - t0)
        result.candidates = scored
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "profile %s request %s: scores %s → %s",
                self.name,
                request.request_id,
                {ep.name: round(s, 4) for ep, s in scored},
                [ep.name for ep in result.targets],
            )
        return result
