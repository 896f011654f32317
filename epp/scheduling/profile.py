"""One scheduling profile: filters narrow the candidates, weighted scorers rank them, the picker chooses."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from epp.framework import (
    CycleState,
    Endpoint,
    Filter,
    InferenceRequest,
    Picker,
    ProfileHandler,
    ProfileResult,
    Scorer,
)
from epp.framework.verbosity import TRACE, V

log = logging.getLogger(__name__)

# The share of picks logged at DEBUG (V(4)) with every scorer's score per endpoint (the explain line). Sampled so
# that DEBUG logging stays affordable under load; at TRACE (V(5)) every pick is logged (pick parity replays).
PICK_LOG_SAMPLE = 0.01
EVERY_PICK = V(TRACE)

# Called with (extension_point, plugin, seconds) when a cycle is sampled for per-plugin timing.
PluginTimer = Callable[[str, Filter | Scorer | Picker | ProfileHandler, float], None]


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
        explain: dict[str, Sequence[float]] | None = None
        if log.isEnabledFor(logging.DEBUG) and (log.isEnabledFor(EVERY_PICK) or random.random() < PICK_LOG_SAMPLE):
            explain = {}
        for scorer, weight in self._pairs:
            if timer is None:
                scores = scorer.score(state, request, endpoints)
            else:
                t0 = time.perf_counter()
                scores = scorer.score(state, request, endpoints)
                timer("Scorer", scorer, time.perf_counter() - t0)
            if len(scores) != n:
                raise ValueError(f"scorer {scorer.name} returned {len(scores)} scores for {n} endpoints")
            if explain is not None:
                explain[f"{scorer.name}*{weight:g}"] = scores
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
        if explain is not None:
            per_endpoint = {
                ep.hostport: {**{k: round(float(v[i]), 4) for k, v in explain.items()}, "total": round(t, 4)}
                for i, (ep, t) in enumerate(scored)
            }
            log.debug(
                "pick request=%s profile=%s picked=%s scores=%s",
                request.request_id,
                self.name,
                ",".join(ep.hostport for ep in result.targets),
                per_endpoint,
            )
        return result
