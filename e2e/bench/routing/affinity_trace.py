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

`lost_reuse` splits the tokens of the unlimited-cache reuse bound that a run did not deliver by why, from the same
client-side ground truth (which pods an earlier request carrying a block was sent to, and when each request's first
token came):

- `engine`: the chosen pod had been sent those blocks but did not deliver them (evicted, or still computing them);
- `slower`: every pod that held more was busy enough that the request would have had its first token there no
  sooner than where it went: its prefill queue at the arrival (until the last first token of the requests sent there
  before) plus the request's own uncached tokens at the engine's prefill rate (the router traded the hit for
  latency);
- `miss`: a pod that held more would have given it its first token sooner (a routing miss).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from e2e.bench.loadgen import Result
from e2e.workloads.base import Request
from e2e.workloads.reuse import block_chain, reusable_blocks

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


@dataclass(slots=True)
class LostReuse:
    """Tokens of the reuse bound (counted requests, served ones), and those not delivered, by why (module doc)."""

    bound: int = 0
    engine: int = 0
    slower: int = 0
    miss: int = 0

    def shares(self) -> dict[str, float]:
        """Each loss as a share of the bound, and the capture where no holder was slower than where it went: what
        was delivered of the bound less the hits traded for latency."""
        b = self.bound
        lost = self.engine + self.slower + self.miss
        return {
            "lost_engine": self.engine / b if b else 0.0,
            "lost_slower": self.slower / b if b else 0.0,
            "lost_miss": self.miss / b if b else 0.0,
            "captured_not_slower": (b - lost) / (b - self.slower) if b > self.slower else float("nan"),
        }


def lost_reuse(
    requests: Sequence[Request],
    results: Sequence[Result],
    ids: Sequence[Sequence[int]],
    block_size: int,
    prefill_tps: float,
    count_after: float = 0.0,
) -> LostReuse:
    """The bound's tokens a run did not deliver, by why (module doc); `ids` are the requests' prompt token ids,
    `prefill_tps` the engines' prefill rate (uncached tokens per second)."""
    order = sorted(range(len(requests)), key=lambda i: requests[i].arrival)
    sent: dict[int, set[str]] = {}  # block key -> pods an earlier request carrying it was sent to
    first_tokens: dict[str, list[float]] = {}  # pod -> when each request sent there had its first token
    out = LostReuse()
    for i in order:
        r, res = requests[i], results[i]
        if res.status != 200 or not res.served_by or res.ttft is None:
            continue
        chain = block_chain(ids[i], block_size)
        held: dict[str, int] = {}  # pod -> its consecutive blocks from block 0 (a chained key implies its prefix)
        bound = 0
        for h in chain[: reusable_blocks(len(ids[i]), block_size)]:
            pods = sent.get(h)
            if not pods:
                break
            bound += 1
            for p in pods:
                held[p] = held.get(p, 0) + 1
        t = r.arrival
        if t >= count_after and bound:
            want = bound * block_size
            got = min(res.cached_tokens, want)
            on_chosen = min(held.get(res.served_by, 0) * block_size, want)
            out.bound += want
            out.engine += max(0, on_chosen - got)
            rest = want - max(got, on_chosen)
            if rest > 0:
                most = max(held.values())
                compute = max(0, len(ids[i]) - most * block_size) / prefill_tps
                waits = [
                    max((ft - t for ft in first_tokens.get(p, ()) if ft > t), default=0.0)
                    for p, k in held.items()
                    if k == most
                ]
                if min(waits) + compute >= res.ttft:
                    out.slower += rest
                else:
                    out.miss += rest
        for h in chain:
            sent.setdefault(h, set()).add(res.served_by)
        first_tokens.setdefault(res.served_by, []).append(t + res.ttft)
    return out
