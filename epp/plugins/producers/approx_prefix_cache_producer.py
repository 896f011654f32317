"""approx-prefix-cache-producer (GIE's default prefix producer): a router-side index of what each endpoint caches.

The EPP remembers which prompt blocks it sent where. A request's text is cut into blocks of
blockSizeTokens x 4 characters, chained-hashed (h_i = H(h_{i-1}, block_i), seeded with the target model and
cache_salt) and matched against the index: an endpoint's match is its run of consecutive hits from the first
block (GIE counts every holder of each hash until a hash nobody holds; a pod whose head blocks were evicted
would then score blocks it cannot reuse). PreRequest records the chosen endpoint's hashes in its bounded LRU.

H is Python's built-in hash of a (int, str) tuple: SipHash for the block text combined with the xxHash-style
tuple mixer, 64-bit, C speed, and randomized per process — fine, because this index never leaves the process.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict, deque
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any, Self

from epp.framework import (
    DISAGG_DECISION,
    PREFIX_CACHE_MATCH_INFO,
    DataKey,
    Endpoint,
    InferenceRequest,
    Params,
    Plugin,
    PluginContext,
    PrefixCacheMatchInfo,
    RemovalListener,
    SchedulingResult,
)
from epp.plugins.contracts.prompt import AVERAGE_CHARS_PER_TOKEN, request_text

PREFILL_PROFILE = "prefill"
HASH_MEMO_SIZE = 64  # prompts whose block hashes are kept, each held with its text ...
HASH_MEMO_CHARS = 65_536  # ... if that is at most this long (bounds the memo at a few MB)
# The prompt's block hashes, from prepare() to PreRequest (one key per producer instance).
BLOCK_HASHES = DataKey[list[int]]("approx-prefix-block-hashes")


def block_hashes(text: str, block_chars: int, max_blocks: int, seed: int) -> list[int]:
    """Chained hashes of the text's blocks (a trailing partial block too); [] below one full block."""
    if len(text) < block_chars:
        return []
    end = min(len(text), max_blocks * block_chars)
    out = []
    h = seed
    for i in range(0, end, block_chars):
        h = hash((h, text[i : i + block_chars]))
        out.append(h)
    return out


log = logging.getLogger(__name__)

_consume: Callable[[Iterable[object]], None] = deque[object](maxlen=0).extend  # runs an iterator to its end in C


class PrefixIndex:
    """Per-endpoint LRU of block hashes plus the reverse map hash → endpoints holding it.

    The endpoint sets are frozen and shared: the blocks one call adds to (or drops from) the same set of holders
    get one new set object between them. A prompt's consecutive blocks are usually held by the same endpoints, so
    `match` checks a run of them once instead of once per block per holder (at 64 endpoints holding a shared system
    prompt that check was most of a scheduling cycle)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._lru: dict[str, OrderedDict[int, None]] = {}
        self._holders: dict[int, frozenset[str]] = {}

    def match(self, hashes: Sequence[int]) -> dict[str, float]:
        """Each endpoint's longest run of consecutive hits from the first block (llm-d's longest prefix)."""
        holders = self._holders
        first = holders.get(hashes[0]) if hashes else None
        if not first:
            return {}
        counts: dict[str, float] = {}
        active = set(first)
        last = first  # active is a subset of the last block's holders (an unchanged frozen set, when shared)
        depth = 1
        for i in range(1, len(hashes)):
            eps = holders.get(hashes[i])
            if eps is not last:
                if not eps:
                    break
                if not active <= eps:
                    for name in active - eps:
                        counts[name] = depth
                    active &= eps
                    if not active:
                        break
                last = eps
            depth += 1
        for name in active:
            counts[name] = depth
        return counts

    def add(self, endpoint: str, hashes: Sequence[int], capacity: int | None = None) -> None:
        lru = self._lru.get(endpoint)
        if lru is None:
            lru = self._lru[endpoint] = OrderedDict()
        holders = self._holders
        touch = lru.move_to_end
        # A repeated prefix (the usual case) is touched in C; the first hash not held yet stops it with a KeyError
        # at an unknown position, so the loop then goes over all of them (touching a held one again is harmless).
        try:
            _consume(map(touch, hashes))
        except KeyError:
            grown: dict[frozenset[str] | None, frozenset[str]] = {}  # old holders -> with endpoint, shared
            for h in hashes:
                try:
                    touch(h)
                except KeyError:
                    lru[h] = None
                    s = holders.get(h)
                    new = grown.get(s)
                    if new is None:
                        new = grown[s] = frozenset((endpoint,)) if s is None else s | {endpoint}
                    holders[h] = new
        cap = capacity or self.capacity
        if len(lru) > cap:
            shrunk: dict[frozenset[str], frozenset[str]] = {}
            while len(lru) > cap:
                old, _ = lru.popitem(last=False)
                self._drop_holder(old, endpoint, shrunk)

    def remove_endpoint(self, endpoint: str) -> None:
        lru = self._lru.pop(endpoint, None)
        shrunk: dict[frozenset[str], frozenset[str]] = {}
        for h in lru or ():
            self._drop_holder(h, endpoint, shrunk)

    def _drop_holder(self, h: int, endpoint: str, shrunk: dict[frozenset[str], frozenset[str]]) -> None:
        """Take `endpoint` out of h's holders; `shrunk` shares the smaller sets within one call."""
        s = self._holders.get(h)
        if s is None or endpoint not in s:
            return
        new = shrunk.get(s)
        if new is None:
            new = shrunk[s] = s - {endpoint}
        if new:
            self._holders[h] = new
        else:
            del self._holders[h]

    def size(self, endpoint: str | None = None) -> int:
        if endpoint is not None:
            return len(self._lru.get(endpoint, ()))
        return sum(len(v) for v in self._lru.values())


class ApproxPrefixCacheProducer(Plugin, RemovalListener):
    type_name = "approx-prefix-cache-producer"
    records_only = True  # PreRequest writes only the routing history: may run after the answer

    def __init__(
        self,
        name: str | None = None,
        block_size_tokens: int = 16,
        max_blocks: int = 256,
        lru_capacity: int = 31250,
        auto_tune: bool = True,
    ) -> None:
        super().__init__(name)
        self.block_size_tokens = block_size_tokens
        self.max_blocks = max_blocks
        self.auto_tune = auto_tune
        self.index = PrefixIndex(lru_capacity)
        self.key = PREFIX_CACHE_MATCH_INFO.of(self.name)
        self._hashes_key = BLOCK_HASHES.of(self.name)
        self._memo: dict[tuple[int, int, str], list[int]] = {}  # recent prompts' hashes (read-only lists)

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        block_tokens = params.int("blockSizeTokens", 16, min=1)
        legacy = params.int("blockSize", 0, min=0)
        if legacy > 0:  # deprecated in llm-d-router: mapped to blockSizeTokens unless that is set, with a warning
            log.warning("%s: parameter 'blockSize' is deprecated, use 'blockSizeTokens'", name)
            if not params.has("blockSizeTokens"):
                block_tokens = legacy
        if params.has("hashBlockSize"):  # v1.0 scorer parameter, in characters
            block_tokens = max(1, params.int("hashBlockSize", 64, min=1) // AVERAGE_CHARS_PER_TOKEN)
        max_blocks = params.int("maxPrefixBlocksToMatch", 256, min=1)
        max_tokens = params.int("maxPrefixTokensToMatch", 0, min=0)
        if max_tokens > 0:
            max_blocks = max(1, max_tokens // block_tokens)
        producer = cls(
            name,
            block_size_tokens=block_tokens,
            max_blocks=max_blocks,
            lru_capacity=params.int("lruCapacityPerServer", 31250, min=1),
            auto_tune=params.bool("autoTune", True),
        )
        context.endpoints.subscribe(producer)
        return producer

    def produces(self) -> Collection[DataKey[Any]]:
        return (self.key,)

    # Datastore listener: prune endpoints that left the pool.
    def endpoint_removed(self, endpoint: Endpoint) -> None:
        self.index.remove_endpoint(endpoint.name)

    def _block_tokens(self, endpoints: Sequence[Endpoint]) -> int:
        if self.auto_tune:
            for ep in endpoints:
                if ep.metrics.cache_block_size > 0:
                    return ep.metrics.cache_block_size
        return self.block_size_tokens

    def hashes_for(self, request: InferenceRequest, block_tokens: int) -> list[int]:
        block_chars = block_tokens * AVERAGE_CHARS_PER_TOKEN
        text = request_text(request, self.max_blocks * block_chars)
        salt = request.body.get("cache_salt") if isinstance(request.body, dict) else None
        seed = hash((request.target_model, salt if isinstance(salt, str) else ""))
        # A prompt seen lately (a retry, a repeated prompt, a fan-out of the same one) is not hashed again: the key
        # costs one pass over the text in C, the chain a Python step per block.
        key = (seed, block_chars, text)
        memo = self._memo
        hashes = memo.get(key)
        if hashes is None:
            hashes = block_hashes(text, block_chars, self.max_blocks, seed)
            if len(text) > HASH_MEMO_CHARS:
                return hashes
            memo[key] = hashes
            if len(memo) > HASH_MEMO_SIZE:
                del memo[next(iter(memo))]
        return hashes

    async def prepare(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> None:
        self.produce(request, endpoints)

    def produce(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> PrefixCacheMatchInfo:
        """Hash the prompt once and match it; the result goes to request.data for scorers and PreRequest."""
        block_tokens = self._block_tokens(endpoints)
        hashes = self.hashes_for(request, block_tokens)
        info = PrefixCacheMatchInfo(len(hashes), block_tokens, self.index.match(hashes) if hashes else {})
        request.data.put(self.key, info)
        request.data.put(self._hashes_key, hashes)
        return info

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        self.record_later(request, self.targets(request, result))

    @staticmethod
    def targets(request: InferenceRequest, result: SchedulingResult) -> list[Endpoint]:
        """The decode pick and, for P/D, the prefill pick: both will hold the prompt's KV blocks."""
        primary = result.targets
        if not primary:
            return []
        targets = [primary[0]]
        decision = request.data.get(DISAGG_DECISION)
        if decision is not None and decision.prefill is not None:
            targets.append(decision.prefill)
        else:
            prefill = result.profile_results.get(PREFILL_PROFILE)
            if prefill is not None and prefill.targets and prefill.targets[0] is not primary[0]:
                targets.append(prefill.targets[0])
        return targets

    def record_later(self, request: InferenceRequest, targets: Sequence[Endpoint]) -> None:
        """File the request's prompt hashes (from prepare) under `targets`."""
        hashes = request.data.get(self._hashes_key)
        if not hashes or not targets:
            return
        try:
            # Off the response's critical path: runs right after the director hands back its decision.
            asyncio.get_running_loop().call_soon(self._record, targets, hashes)
        except RuntimeError:
            self._record(targets, hashes)

    def _record(self, targets: Sequence[Endpoint], hashes: Sequence[int]) -> None:
        for ep in targets:
            cap = ep.metrics.cache_num_blocks if self.auto_tune and ep.metrics.cache_num_blocks > 0 else None
            self.index.add(ep.name, hashes, cap)
