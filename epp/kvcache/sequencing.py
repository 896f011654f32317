"""Sequence tracking per (pod, dp rank): decide whether a batch is next, late, a gap or a restart.

vLLM numbers the batches of each publisher (one per DP rank) 0, 1, 2, ...; the SUB socket drops messages
when a queue overflows and a new subscriber misses what was sent before it connected. So:
next → apply; gap → replay from last+1; first batch seen with seq > 0 → replay from 0 (mid-stream join);
seq below what we applied → the publisher restarted: clear the pod, then replay from 0;
seq equal to the last applied → a duplicate (e.g. overlap of replay and live): drop.
"""

from __future__ import annotations

import enum


class Verdict(enum.Enum):
    APPLY = "apply"
    DUPLICATE = "duplicate"
    GAP = "gap"
    JOIN = "join"
    RESTART = "restart"


class SequenceTracker:
    """Two watermarks per (pod, rank), as llm-d's router keeps them: the last seq seen live on the wire
    (a live seq going back means the publisher restarted) and the last seq applied to the index (replayed
    batches can run ahead of the live stream; live copies of those are duplicates, not restarts)."""

    def __init__(self) -> None:
        self._live: dict[tuple[str, int], int] = {}
        self._applied: dict[tuple[str, int], int] = {}
        self._crc: dict[tuple[str, int], int] = {}  # crc32 of the last applied payload

    def check(self, pod: str, rank: int, seq: int, live: bool = True) -> Verdict:
        key = (pod, rank)
        if live:
            seen = self._live.get(key)
            if seen is not None and seq <= seen:
                return Verdict.RESTART if seq < seen else Verdict.DUPLICATE
            self._live[key] = seq
        applied = self._applied.get(key)
        if applied is None:
            return Verdict.APPLY if seq == 0 else Verdict.JOIN
        if seq <= applied:
            return Verdict.DUPLICATE
        if seq == applied + 1:
            return Verdict.APPLY
        return Verdict.GAP

    def last(self, pod: str, rank: int) -> int | None:
        return self._applied.get((pod, rank))

    def ranks(self, pod: str) -> list[int]:
        """The ranks of `pod` with an applied batch: its batches' `dp_rank`, which need not be 0 nor the
        endpoint's index (one publisher per DP rank, each numbering its own batches)."""
        return sorted(r for p, r in self._applied if p == pod)

    def applied(self, pod: str, rank: int, seq: int, crc: int = 0) -> None:
        self._applied.pop((pod, rank), None)  # re-inserted last: the dict's order is the order of last use
        self._applied[(pod, rank)] = seq
        self._crc[(pod, rank)] = crc

    def forget_least_recent_rank(self, pod: str) -> int | None:
        """Forget the rank of `pod` whose last batch was applied longest ago (to make room for a new one)."""
        rank = next((r for p, r in self._applied if p == pod), None)
        if rank is not None:
            for d in (self._live, self._applied, self._crc):
                d.pop((pod, rank), None)
        return rank

    def last_crc(self, pod: str, rank: int) -> int | None:
        return self._crc.get((pod, rank))

    def restarted(self, pod: str, rank: int, seq: int) -> None:
        """Forget every rank of `pod` (its index entries are being cleared) and take `seq` as the live mark."""
        self.forget_pod(pod)
        self._live[(pod, rank)] = seq

    def forget_pod(self, pod: str) -> None:
        for d in (self._live, self._applied, self._crc):
            for k in [k for k in d if k[0] == pod]:
                del d[k]
