"""The bench's per-request check of where each request went against the pods that had its prefix."""

from __future__ import annotations

from e2e.bench.loadgen import Result
from e2e.bench.routing.affinity_trace import busy_at_arrival, classify, lost_reuse, summary
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


def test_lost_reuse_says_why_each_hit_was_not_delivered() -> None:
    """Block size 4: a 13-token prompt can hit 3 blocks (12 tokens); a prompt extending it by 8 can hit 5."""
    base = list(range(13))
    longer = base[:12] + list(range(100, 109))
    ids = [base, longer, longer, longer, longer, base]
    requests = [req(0.0, "a"), req(1.0, "a"), req(2.0, "a"), req(3.0, "a"), req(3.1, "a"), req(9.0, "a")]
    results = [
        res("p1", 0.5),  # first: nothing to reuse
        res("p1", 0.2, cached=12),  # all 12 reusable tokens delivered
        res("p2", 0.3, cached=0),  # p1 held 20 and was idle: a miss
        res("p1", 2.0, cached=4),  # the chosen pod held 20 but delivered 4: engine (evicted)
        res("p3", 0.3, cached=0),  # p1 and p2 held 20; p1 prefills until 5.0, p2 until 2.3: a miss
        res("p2", 0.1, cached=8),  # 12 on p2, 4 delivered short: engine
    ]
    fast = 1e9  # prefill tokens/s: the one uncached token on a holder costs nothing
    out = lost_reuse(requests, results, ids, block_size=4, prefill_tps=fast)
    assert (out.bound, out.engine, out.slower, out.miss) == (12 + 20 + 20 + 20 + 12, 16 + 4, 0, 20 + 20)
    # at 2 tokens/s the holders' one uncached token takes 0.5 s, longer than the 0.3 s both requests got elsewhere
    out = lost_reuse(requests, results, ids, block_size=4, prefill_tps=2.0)
    assert (out.engine, out.slower, out.miss) == (16 + 4, 40, 0)
    # the same, but p2 prefills until 3.5: both holders' queues outlast the 0.3 s the request got on p3, so the
    # hit was traded for latency, not missed
    results[2] = res("p2", 1.5, cached=0)
    out = lost_reuse(requests, results, ids, block_size=4, prefill_tps=fast)
    assert (out.engine, out.slower, out.miss) == (16 + 4, 20, 20)
    shares = out.shares()
    assert shares["lost_slower"] == 20 / out.bound
    assert shares["captured_not_slower"] == (out.bound - 60) / (out.bound - 20)
    # requests before the warm-up fill the record but are not counted
    assert lost_reuse(requests, results, ids, block_size=4, prefill_tps=fast, count_after=2.5).bound == 20 + 20 + 12
