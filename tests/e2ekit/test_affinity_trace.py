"""The bench's per-request check of where each request went against the pods that had its prefix."""

from __future__ import annotations

from e2e.bench.affinity_trace import busy_at_arrival, classify, summary
from e2e.bench.loadgen import Result
from e2e.workloads.base import Request


def req(t: float, group: str) -> Request:
    return Request(arrival=t, api="completions", body={}, group=group)


def res(pod: str, ttft: float, e2e: float = 1.0, cached: int = 0, status: int = 200) -> Result:
    return Result("", status, ttft if status == 200 else None, e2e, cached_tokens=cached, served_by=pod)


def test_classes() -> None:
    requests = [req(0.0, "a"), req(0.1, "a"), req(0.2, "a"), req(0.6, "a"), req(0.7, "a"), req(0.8, "b")]
    results = [
        res("p1", 0.5),  # first of a; p1 holds a from 0.5
        res("p1", 0.5),  # stuck
        res("p2", 0.5),  # elsewhere while p1 was still computing a
        res("p3", 0.5),  # elsewhere while p1 (and p2 from 0.7) held it
        res("p0", 0.5, status=503),
        res("p1", 0.5),
    ]
    assert classify(requests, results) == ["first", "stuck", "split_computing", "split_held", "failed", "first"]
    out = summary(requests, results, system_len=100, slots=2)
    assert (out["first"], out["stuck"], out["split_computing"], out["split_held"]) == (2, 1, 1, 1)
    assert out["recomputed"] == 3  # every non-first served request had cached 0 < 100


def test_busy_at_arrival() -> None:
    requests = [req(0.0, "a"), req(0.1, "a"), req(0.2, "a"), req(3.0, "a")]
    results = [res("p1", 0.1, e2e=1.0), res("p1", 0.1, e2e=1.0), res("p2", 0.1), res("p1", 0.1)]
    assert busy_at_arrival(requests, results) == [0, 1, 0, 0]
