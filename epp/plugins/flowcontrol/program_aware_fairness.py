"""program-aware-fairness (llm-d-router flow control): a priority band dispatches from the program (fairness id)
with the Least Attained Service, weighed against how long its head request has waited.

score = lasWeightService·(1 - norm(service)) + lasWeightHeadWait·norm(head wait), each normalized over the band's
queued programs; the highest score dispatches. A program's service is input tokens + 2·output tokens of its
completed requests. As in llm-d-router v0.10 (`program-aware/strategy_las.go`), only inactive programs (nothing
queued, nothing in flight) decay, at each pick: by `lasDecayFactor` per pick (default 0.99997), or, when
`lasHalfLifeSeconds` > 0, halved every that many seconds of wall-clock time since their last completion. Programs
with nothing in flight and no completion for `evictionTtlSeconds` are forgotten (swept every
`evictionSweepSeconds`; a TTL of 0 keeps them).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Self

from epp.framework import Endpoint, InferenceRequest, Params, Plugin, PluginContext, SchedulingResult, Usage

WEIGHT_INPUT, WEIGHT_OUTPUT = 1, 2


@dataclass(slots=True)
class _Program:
    service: float = 0.0
    anchor: float = 0.0
    last_completion: float = 0.0
    in_flight: int = 0


def _norm(v: float, lo: float, hi: float) -> float:
    return 0.0 if hi <= lo else (v - lo) / (hi - lo)


class ProgramAwareFairness(Plugin):
    type_name = "program-aware-fairness"
    strict = False

    def __init__(
        self,
        name: str | None = None,
        weight_service: float = 0.8,
        weight_head_wait: float = 0.2,
        decay_factor: float = 0.99997,
        half_life: float = 0.0,
        eviction_ttl: float = 3600.0,
        sweep_every: float = 300.0,
    ) -> None:
        super().__init__(name)
        self.weight_service, self.weight_head_wait = weight_service, weight_head_wait
        self.decay_factor = decay_factor
        self.half_life, self.eviction_ttl, self.sweep_every = half_life, eviction_ttl, sweep_every
        self.programs: dict[str, _Program] = {}
        self._last_sweep = time.monotonic()

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        params.str("strategy", "las", choices=("las",))
        return cls(
            name,
            params.float("lasWeightService", 0.8, min=0.0),
            params.float("lasWeightHeadWait", 0.2, min=0.0),
            params.float("lasDecayFactor", 0.99997, min=0.0, max=1.0, min_exclusive=True),
            params.float("lasHalfLifeSeconds", 0.0, min=0.0),
            params.float("evictionTtlSeconds", 3600.0, min=0.0),
            params.float("evictionSweepSeconds", 300.0, min=0.0, min_exclusive=True),
        )

    def _program(self, pid: str) -> _Program:
        p = self.programs.get(pid)
        if p is None:
            now = time.monotonic()
            p = self.programs[pid] = _Program(anchor=now, last_completion=now)
        return p

    def service(self, pid: str) -> float:
        """The program's attained service (0 for a program not seen)."""
        p = self.programs.get(pid)
        return p.service if p is not None else 0.0

    def _decay(self, p: _Program, now: float) -> None:
        """One pick's decay of an inactive program (strategy_las.go's lasState.Decay)."""
        if self.half_life > 0:
            if now > p.anchor:
                p.service *= 0.5 ** ((now - p.anchor) / self.half_life)
                p.anchor = now
        else:
            p.service *= self.decay_factor

    def pick_flow(self, flows: Mapping[str, tuple[int, float]]) -> str | None:
        """The flow to dispatch from: {fairness id: (queued, head enqueue time)} → fairness id."""
        now = time.monotonic()
        self._sweep(now, keep=flows)
        for pid, p in self.programs.items():
            if not p.in_flight and not flows.get(pid, (0, 0.0))[0]:
                self._decay(p, now)
        entries = {fid: (self.service(fid), (now - head) * 1000.0) for fid, (n, head) in flows.items() if n}
        if not entries:
            return None
        services = [e[0] for e in entries.values()]
        waits = [e[1] for e in entries.values()]
        s_lo, s_hi, w_lo, w_hi = min(services), max(services), min(waits), max(waits)
        best, best_score = None, float("-inf")
        for fid, (svc, wait) in entries.items():
            score = self.weight_service * (1 - _norm(svc, s_lo, s_hi)) + self.weight_head_wait * _norm(wait, w_lo, w_hi)
            if score > best_score:
                best, best_score = fid, score
        return best

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        self._program(request.fairness_id).in_flight += 1

    def response_complete(self, request: InferenceRequest, endpoint: Endpoint | None, usage: Usage | None) -> None:
        now = time.monotonic()
        p = self._program(request.fairness_id)
        p.in_flight = max(0, p.in_flight - 1)
        p.last_completion = now
        if usage is not None:
            p.anchor = now
            p.service += WEIGHT_INPUT * usage.prompt_tokens + WEIGHT_OUTPUT * usage.completion_tokens

    def _sweep(self, now: float, keep: Mapping[str, object]) -> None:
        """Forget idle programs (nothing queued or in flight, no completion within the TTL)."""
        if self.eviction_ttl <= 0 or now - self._last_sweep < self.sweep_every:
            return
        self._last_sweep = now
        ttl = self.eviction_ttl
        idle = [
            k for k, p in self.programs.items() if k not in keep and not p.in_flight and now - p.last_completion > ttl
        ]
        for pid in idle:
            del self.programs[pid]
