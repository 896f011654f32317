"""Reuse bounds of a workload: the share of prompt tokens a cache could serve from blocks an earlier request (in
arrival order) already computed, with unlimited capacity (`reuse_bound`) and with the pool's (`capacity_bound`).

Prompts are tokenized as the simulator does (completions as is, chat through the Qwen2.5 template) and cut
into full blocks of `block_size` tokens chained by hash, the way vLLM keys prefix blocks; like vLLM, the last
prompt token is always computed, so a request hits at most (n - 1) // block_size blocks. No routing and no
finite cache can capture more than the unlimited bound.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from e2e.sim.tokenizer import SimTokenizer, shared_tokenizer
from e2e.workloads.base import Request


@dataclass(slots=True)
class ReuseBound:
    prompt_tokens: int
    reusable_tokens: int

    @property
    def share(self) -> float:
        return self.reusable_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


@dataclass(slots=True)
class Arrival:
    """One request as the bounds see it: its prompt length, its block chain, and whether it is counted."""

    tokens: int
    chain: list[int]
    reusable: int  # leading blocks of `chain` that can hit (reusable_blocks)
    counted: bool  # False for a warm-up request: it fills caches, its hits are not counted


def prompt_ids(req: Request, tok: SimTokenizer) -> list[int]:
    if req.api == "chat":
        return tok.chat_ids(req.body["messages"], add_generation_prompt=True)
    return tok.encode(str(req.body["prompt"]))


def arrivals(
    requests: Sequence[Request],
    block_size: int,
    tok: SimTokenizer | None = None,
    ids: list[list[int]] | None = None,
    count_after: float = 0.0,
) -> Iterator[Arrival]:
    """The requests in arrival order. `ids` (the requests' token ids, in the same order) skips tokenizing again;
    requests arriving before `count_after` (a warm-up) are not counted."""
    tok = tok or shared_tokenizer()
    for i in sorted(range(len(requests)), key=lambda i: requests[i].arrival):
        toks = ids[i] if ids is not None else prompt_ids(requests[i], tok)
        n = len(toks)
        yield Arrival(
            n, block_chain(toks, block_size), reusable_blocks(n, block_size), requests[i].arrival >= count_after
        )


def reuse_bound(
    requests: Sequence[Request],
    block_size: int,
    tok: SimTokenizer | None = None,
    ids: list[list[int]] | None = None,
    count_after: float = 0.0,
) -> ReuseBound:
    """One cache that never evicts. Arguments as `arrivals`'."""
    seen: set[int] = set()
    total = reused = 0
    for a in arrivals(requests, block_size, tok, ids, count_after):
        total += a.tokens if a.counted else 0
        for h in a.chain[: a.reusable]:
            if h not in seen:
                break
            reused += block_size if a.counted else 0
        seen.update(a.chain)
    return ReuseBound(total, reused)


def capacity_bound(
    requests: Sequence[Request],
    block_size: int,
    capacity_blocks: int,
    tok: SimTokenizer | None = None,
    ids: list[list[int]] | None = None,
    count_after: float = 0.0,
) -> ReuseBound:
    """An upper bound on the prompt tokens any placement of the requests over N pods of C blocks each, with any
    eviction, serves from cache: Belady's offline-optimal eviction (with bypass) over one pooled cache of
    `capacity_blocks` = N x C blocks, each request's blocks accessed one by one in chain order.

    Why it bounds every placement: at any instant the union of the N pods' caches holds at most N x C distinct
    blocks and only blocks requested before, and a request's prefix hit on its pod is a prefix hit on the union;
    so the union's contents over time are one feasible schedule of a pooled N x C cache, hitting at least as
    often. A pooled schedule that keeps the request's first `a` blocks while it is served and then loads or drops
    blocks of its chain is one of single-block paging with bypass (load the missing blocks after the hits,
    evicting only blocks the schedule drops), which Belady's rule solves optimally. Warm-up requests and a
    prompt's last, never-hit block are accesses whose hit is not counted: each splits its block into a before
    and an after page, so the eviction rule sees the next *counted* access (or none). A parent block is accessed
    whenever its child is, and just before it, so the cache stays prefix-closed and every hit counted is a prefix
    hit (the bound never exceeds `reuse_bound`).

    Relaxed on purpose (hence achievable by no real pool in general): blocks held by running requests and their
    output tokens take no space, requests are served instantly in arrival order, and one pooled cache ignores
    that a prefix shared by requests on several pods is stored once per pod."""
    if capacity_blocks < 1:
        raise ValueError(f"capacity_blocks must be at least 1, got {capacity_blocks}")
    seq: list[int] = []  # every request's blocks, request after request, in chain order
    gain: list[bool] = []  # whether a hit at this access is counted
    total = 0
    for a in arrivals(requests, block_size, tok, ids, count_after):
        total += a.tokens if a.counted else 0
        seq.extend(a.chain)
        gain.extend(a.counted and j < a.reusable for j in range(len(a.chain)))
    never = len(seq)
    nxt = [never] * len(seq)  # the next access of the same block, if that one is counted
    last: dict[int, int] = {}
    for k in range(len(seq) - 1, -1, -1):
        j = last.get(seq[k])
        if j is not None and gain[j]:
            nxt[k] = j
        last[seq[k]] = k
    cache: dict[int, int] = {}  # block -> its next counted access
    heap: list[tuple[int, int]] = []  # (-next access, block), stale entries skipped
    hits = 0
    for k, h in enumerate(seq):
        use = nxt[k]
        if h in cache:
            hits += gain[k]
        elif len(cache) >= capacity_blocks:
            while cache.get(heap[0][1]) != -heap[0][0]:
                heapq.heappop(heap)
            if -heap[0][0] <= use:
                continue  # bypass: no cached block is needed later than this one
            del cache[heapq.heappop(heap)[1]]
        cache[h] = use
        heapq.heappush(heap, (-use, h))
    return ReuseBound(total, hits * block_size)


def block_chain(toks: Sequence[int], block_size: int) -> list[int]:
    """The prompt's full blocks, each keyed by a hash chained over every block before it (a key implies its
    prefix)."""
    out, parent = [], 0
    for b in range(len(toks) // block_size):
        parent = hash((parent, tuple(toks[b * block_size : (b + 1) * block_size])))
        out.append(parent)
    return out


def reusable_blocks(n: int, block_size: int) -> int:
    """At most this many blocks of an `n`-token prompt can hit: the last prompt token is always computed."""
    return max(0, (n - 1) // block_size)
