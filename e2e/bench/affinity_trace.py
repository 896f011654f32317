"""Per request, did the router send it where its prefix already was (or was being computed)?

Ground truth from the client's side, no EPP internals: requests of one group share a prefix; a pod "has" the group
from the moment an earlier request of the group was sent to it (computing), and "holds" it once such a request has
streamed its first token (its prefill is done). Each request is classed by where it went against the pods that had
its group when it arrived:

- `first`: no pod had the group;
- `stuck`: it went to a pod that had it;
- `split_computing`: it went elsewhere while every pod that had the group was still computing it (the window
  between a pick and the engine's KV event, covered only by the picking replica's speculative entries);
- `split_held`: it went elsewhere while some pod held it (a load decision, or an eviction the bench cannot see).

Comparing the counts between one replica and two on the same requests tells a routing difference from noise.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from e2e.bench.loadgen import Result
from e2e.workloads.base import Request

CLASSES = ("first", "stuck", "split_computing", "split_held")


def classify(requests: Sequence[Request], results: Sequence[Result]) -> list[str]:
    """One class per request (results in the workload's order; a failed request is classed `failed`)."""
    order = sorted(range(len(requests)), key=lambda i: requests[i].arrival)
    # per group: pod -> earliest time it held the group (first token of a request sent there), and pods sent to
    sent: dict[str, set[str]] = {}
    held_at: dict[tuple[str, str], float] = {}
    for i in order:
        r, res = requests[i], results[i]
        if res.status == 200 and res.ttft is not None and res.served_by:
            key = (r.group, res.served_by)
            t = r.arrival + res.ttft
            if t < held_at.get(key, float("inf")):
                held_at[key] = t
    out = ["failed"] * len(requests)
    for i in order:
        r, res = requests[i], results[i]
        if res.status != 200 or not res.served_by:
            continue
        pods = sent.setdefault(r.group, set())
        if not pods:
            cls = "first"
        elif res.served_by in pods:
            cls = "stuck"
        elif any(held_at.get((r.group, p), float("inf")) <= r.arrival for p in pods):
            cls = "split_held"
        else:
            cls = "split_computing"
        out[i] = cls
        pods.add(res.served_by)
    return out


def busy_at_arrival(requests: Sequence[Request], results: Sequence[Result]) -> list[int]:
    """Per served request: how many earlier requests were still running on the pod it was sent to when it arrived
    (the load the router sent it into, as the client sees it)."""
    spans: dict[str, list[tuple[float, float]]] = {}
    for r, res in zip(requests, results, strict=True):
        if res.status == 200 and res.served_by:
            spans.setdefault(res.served_by, []).append((r.arrival, r.arrival + res.e2e))
    out = []
    for r, res in zip(requests, results, strict=True):
        if res.status == 200 and res.served_by:
            t = r.arrival
            out.append(sum(1 for a, e in spans[res.served_by] if a < t < e))
    return out


def summary(
    requests: Sequence[Request], results: Sequence[Result], system_len: int, slots: int = 4
) -> dict[str, float]:
    """Counts per class, the requests that recomputed their group's prefix (cached < `system_len` tokens although
    an earlier request of the group had been sent somewhere), and the requests already running on the chosen pod at
    each arrival (mean, and how many arrivals found all `slots` taken)."""
    classes = classify(requests, results)
    counts = Counter(classes)
    out: dict[str, float] = {c: float(counts.get(c, 0)) for c in CLASSES}
    busy = busy_at_arrival(requests, results)
    out["busy_mean"] = sum(busy) / len(busy) if busy else 0.0
    out["busy_full"] = float(sum(1 for b in busy if b >= slots))
    out["recomputed"] = float(
        sum(
            1
            for c, res in zip(classes, results, strict=True)
            if c not in ("first", "failed") and res.cached_tokens < system_len
        )
    )
    return out
