"""burst-prefix-cache-producer (llm-d): co-locates bursts of requests that share a prompt (RL rollout samples,
parallel sub-agents) so the shared prefix is prefilled once instead of on every cold replica.

Requests arriving within `windowDurationMs` are assigned jointly when the window closes: identical prompts (up to
the block cap) form a group placed as a unit, whole on one replica (or `maxPerReplica` per replica, spilling to the
next least-loaded one). With `minColocateBlocks` > 0 a single request that shares at least that many leading blocks
with another request of the window also becomes a unit, and a unit prefers a replica already holding a unit with
that many shared blocks, while that replica is under its fair share of the window. Units are placed longest prefix
first, groups before singles. `balanceBy: requests` balances request counts; `tokens` balances prefix blocks,
charging a unit's prefix once per replica minus the leading blocks that replica already got in this window. Ties go
to fewer running requests (scraped), then the lower name. The result is `PREFIX_CACHE_MATCH_INFO.of(<name>)` with a
full match on the assigned replica and none elsewhere: point a prefix-cache-scorer (or the affinity filter) at it.
A request that overlaps nobody gets no affinity. Every request waits up to the window; the director's producer
budget is extended to the window plus 300 ms.

Blocks are `blockSizeTokens` tokens of the token-producer's ids when one runs, else 4·blockSizeTokens characters.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Self

from epp.framework import (
    PREFIX_CACHE_MATCH_INFO,
    TOKENIZED_PROMPT,
    DataKey,
    Endpoint,
    InferenceRequest,
    Params,
    Plugin,
    PluginContext,
    PrefixCacheMatchInfo,
    Stability,
)
from epp.plugins.contracts.prompt import AVERAGE_CHARS_PER_TOKEN, request_text
from epp.plugins.producers.approx_prefix_cache_producer import block_hashes

UNLIMITED = -1
DEFAULT_MAX_BLOCKS = 2048
MAX_WINDOW_MS = 10000
TIMEOUT_MARGIN = 0.3


@dataclass(eq=False)
class _Entry:
    hashes: tuple[int, ...]
    pods: Sequence[Endpoint]
    assigned: Endpoint | None = None


@dataclass(eq=False)
class _Batch:
    entries: list[_Entry] = field(default_factory=list)
    sealed: asyncio.Future[None] | None = None
    closed: bool = False


def token_block_hashes(tokens: Sequence[int], block: int, max_blocks: int, seed: int) -> list[int]:
    """Chained hashes of `block`-token blocks (a trailing partial block too)."""
    out = []
    h = seed
    for i in range(0, min(len(tokens), block * max_blocks), block):
        h = hash((h, tuple(tokens[i : i + block])))
        out.append(h)
    return out


class BurstPrefixCacheProducer(Plugin):
    type_name = "burst-prefix-cache-producer"
    stability = Stability.ALPHA

    def __init__(
        self,
        name: str | None = None,
        *,
        window_ms: int = 100,
        max_per_replica: int = UNLIMITED,
        block_size_tokens: int = 64,
        max_prefix_tokens: int = 0,
        min_colocate_blocks: int = 0,
        max_batch_size: int = 1000,
        balance_by: str = "requests",
    ) -> None:
        super().__init__(name)
        self.window = window_ms / 1000.0
        self.max_per_replica = max_per_replica
        self.block_size = block_size_tokens
        self.max_blocks = max_prefix_tokens // block_size_tokens if max_prefix_tokens > 0 else DEFAULT_MAX_BLOCKS
        self.min_colocate = min_colocate_blocks
        self.max_batch = max_batch_size
        self.by_tokens = balance_by == "tokens"
        self.key = PREFIX_CACHE_MATCH_INFO.of(self.name)
        self.produce_timeout = self.window + TIMEOUT_MARGIN
        self._batch: _Batch | None = None

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        window = params.int("windowDurationMs", 100, min=1)
        if window > MAX_WINDOW_MS:
            raise params.fail("windowDurationMs", f"must be <= {MAX_WINDOW_MS}")
        per_replica = params.int("maxPerReplica", UNLIMITED)
        if per_replica != UNLIMITED and per_replica < 1:
            raise params.fail("maxPerReplica", "must be -1 (unlimited) or >= 1")
        block = params.int("blockSizeTokens", 64, min=1)
        max_tokens = params.int("maxPrefixTokensToMatch", 0, min=0)
        if 0 < max_tokens < block:
            raise params.fail("maxPrefixTokensToMatch", f"must be 0 or >= blockSizeTokens ({block})")
        batch = params.int("maxBatchSize", 1000)
        if batch != UNLIMITED and batch < 1:
            raise params.fail("maxBatchSize", "must be -1 (unlimited) or >= 1")
        return cls(
            name,
            window_ms=window,
            max_per_replica=per_replica,
            block_size_tokens=block,
            max_prefix_tokens=max_tokens,
            min_colocate_blocks=params.int("minColocateBlocks", 0, min=0),
            max_batch_size=batch,
            balance_by=params.str("balanceBy", "requests", choices=("requests", "tokens")) or "requests",
        )

    def produces(self) -> Collection[DataKey[Any]]:
        return (self.key,)

    def uses(self) -> Collection[DataKey[Any]]:
        return (TOKENIZED_PROMPT,)

    def hashes_for(self, request: InferenceRequest) -> tuple[int, ...]:
        salt = request.body.get("cache_salt") if isinstance(request.body, dict) else None
        seed = hash((request.target_model, salt if isinstance(salt, str) else ""))
        tokenized = request.data.get(TOKENIZED_PROMPT)
        if tokenized is not None:
            return tuple(token_block_hashes(tokenized.token_ids, self.block_size, self.max_blocks, seed))
        block_chars = self.block_size * AVERAGE_CHARS_PER_TOKEN
        text = request_text(request, self.max_blocks * block_chars)
        return tuple(block_hashes(text, block_chars, self.max_blocks, seed))

    async def prepare(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> None:
        entry = _Entry(self.hashes_for(request), endpoints)
        batch = self._batch
        if batch is None:
            loop = asyncio.get_running_loop()
            batch = self._batch = _Batch(sealed=loop.create_future())
            loop.call_later(self.window, self.seal, batch)
        if self.max_batch != UNLIMITED and len(batch.entries) >= self.max_batch:
            raise RuntimeError(f"burst prefix batch full: maxBatchSize {self.max_batch} reached")
        batch.entries.append(entry)
        assert batch.sealed is not None
        await asyncio.shield(batch.sealed)
        total = len(entry.hashes)
        matches: dict[str, float] = {}
        if entry.assigned is not None and any(ep.name == entry.assigned.name for ep in endpoints):
            matches[entry.assigned.name] = total
        request.data.put(self.key, PrefixCacheMatchInfo(total, self.block_size, matches))

    def seal(self, batch: _Batch) -> None:
        if batch.closed:
            return
        batch.closed = True
        if self._batch is batch:
            self._batch = None
        assign(batch.entries, self.max_per_replica, self.min_colocate, self.by_tokens)
        if batch.sealed is not None and not batch.sealed.done():
            batch.sealed.set_result(None)


# -- the joint assignment (llm-d's assign.go) -------------------------------------------------------------------


def assign(entries: Sequence[_Entry], k: int, min_colocate: int, by_tokens: bool) -> None:
    groups: dict[tuple[int, ...], list[_Entry]] = {}
    replicas: Sequence[Endpoint] = ()
    for e in entries:
        if not e.hashes:
            continue
        groups.setdefault(e.hashes, []).append(e)
        if not replicas:
            replicas = e.pods
    if not replicas:
        return
    shared = _shared_prefix_keys(groups, min_colocate)
    group_units = [key for key, members in groups.items() if len(members) >= 2]
    single_units = [key for key, members in groups.items() if len(members) == 1 and key in shared]
    if not group_units and not single_units:
        return
    # longest prefix first within each tier (stable)
    group_units.sort(key=len, reverse=True)
    single_units.sort(key=len, reverse=True)
    units = group_units + single_units
    total = sum(len(key) if by_tokens else len(groups[key]) for key in units)
    max_share = -(-total // len(replicas))  # ceil: the fair share per replica
    holders: dict[int, set[str]] = {}
    load: dict[str, int] = {}
    for key in units:
        _place(groups[key], replicas, k, min_colocate, max_share, len(key), holders, load, by_tokens)


def _shared_prefix_keys(groups: dict[tuple[int, ...], list[_Entry]], min_colocate: int) -> set[tuple[int, ...]]:
    """Keys sharing at least min_colocate leading blocks with some other request of the window."""
    if min_colocate <= 0:
        return set()
    count: dict[tuple[int, ...], int] = {}
    sig: dict[tuple[int, ...], tuple[int, ...]] = {}
    for key, members in groups.items():
        if len(key) < min_colocate:
            continue
        s = key[:min_colocate]
        sig[key] = s
        count[s] = count.get(s, 0) + len(members)
    return {key for key, s in sig.items() if count[s] >= 2}


def _longest_prefix(holders: dict[int, set[str]], hashes: Sequence[int]) -> dict[str, int]:
    """Per replica, how many leading blocks of `hashes` it already got in this window (llm-d counts every holder of
    each block until a block nobody holds)."""
    res: dict[str, int] = {}
    for h in hashes:
        who = holders.get(h)
        if not who:
            break
        for name in who:
            res[name] = res.get(name, 0) + 1
    return res


def _place(
    members: list[_Entry],
    replicas: Sequence[Endpoint],
    k: int,
    min_colocate: int,
    max_share: int,
    cost: int,
    holders: dict[int, set[str]],
    load: dict[str, int],
    by_tokens: bool,
) -> None:
    hashes = members[0].hashes
    prefer = min_colocate > 0
    matches = _longest_prefix(holders, hashes) if prefer or by_tokens else {}
    per_replica: dict[str, int] = {}
    i = 0
    while i < len(members):
        target = _pick(replicas, per_replica, k, load, matches, min_colocate, max_share, prefer)
        name = target.name
        run = len(members) - i
        if k != UNLIMITED:
            run = min(run, max(1, k - per_replica.get(name, 0)))
        for m in itertools.islice(members, i, i + run):
            m.assigned = target
        first = per_replica.get(name, 0) == 0
        per_replica[name] = per_replica.get(name, 0) + run
        if not by_tokens:
            load[name] = load.get(name, 0) + run
        elif first:
            load[name] = load.get(name, 0) + max(0, cost - matches.get(name, 0))
        i += run
        prefer = False  # only the primary replica gets the prefix preference
    for m in members:
        if m.assigned is not None:
            for h in hashes:
                holders.setdefault(h, set()).add(m.assigned.name)


def _pick(
    replicas: Sequence[Endpoint],
    per_replica: dict[str, int],
    k: int,
    load: dict[str, int],
    matches: dict[str, int],
    min_colocate: int,
    max_share: int,
    prefer: bool,
) -> Endpoint:
    if prefer:
        best: Endpoint | None = None
        best_match = 0
        for r in replicas:
            if k != UNLIMITED and per_replica.get(r.name, 0) >= k:
                continue
            if load.get(r.name, 0) >= max_share:
                continue
            m = matches.get(r.name, 0)
            if m < min_colocate:
                continue
            if best is None or m > best_match or (m == best_match and _less(r, best, load)):
                best, best_match = r, m
        if best is not None:
            return best
    pick: Endpoint | None = None
    for r in replicas:
        if k != UNLIMITED and per_replica.get(r.name, 0) >= k:
            continue
        if pick is None or _less(r, pick, load):
            pick = r
    if pick is not None:
        return pick
    for r in replicas:
        if pick is None or _less(r, pick, load):
            pick = r
    assert pick is not None
    return pick


def _less(a: Endpoint, b: Endpoint, load: dict[str, int]) -> bool:
    """a before b: lower window load, then fewer running requests, then the lower name."""
    la, lb = load.get(a.name, 0), load.get(b.name, 0)
    if la != lb:
        return la < lb
    ra, rb = a.metrics.running_requests_size, b.metrics.running_requests_size
    if ra != rb:
        return ra < rb
    return a.name < b.name
