"""A vLLM-like paged KV cache: fixed capacity in blocks, prefix reuse by chained block hashes, LRU eviction.

Only full blocks are hashed and cached (as in vLLM). A block is either free, held by running requests
(ref > 0), or cached and unreferenced (evictable, oldest release first; a request's blocks are released
tail-first so a chain is evicted from its end, like vLLM's free queue). Every change that vLLM would
announce is turned into a BlockStored / BlockRemoved / AllBlocksCleared event handed to `emit`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from e2e.sim.events import MEDIUM_GPU, AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from e2e.sim.hashing import hash_block_tokens, none_hash, to_external


@dataclass
class LoraRef:
    name: str
    path: str
    adapter_id: int


@dataclass
class Allocation:
    """The blocks one request holds: cached prefix blocks it reused, plus a count of private ones."""

    hashes: list[bytes]  # full-block hashes of the prompt (all of them, cached or not)
    hit_blocks: int  # leading blocks found in the cache (ref'd)
    private_blocks: int  # blocks taken from the pool for the rest of prompt + output
    registered: list[bytes] = field(default_factory=list)  # new hashes this request put in the cache (ref'd)
    released: bool = False


class NoSpace(Exception):
    """Not enough free or evictable blocks right now."""


class KVCache:
    def __init__(
        self,
        *,
        num_blocks: int,
        block_size: int,
        emit: Callable[[list[KVEvent]], None],
        hash_seed: str | None = None,
        hash_format: str = "int",
        enable_prefix_caching: bool = True,
    ) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.emit = emit
        self.hash_format = hash_format
        self.enable_prefix_caching = enable_prefix_caching
        self.none_hash = none_hash(hash_seed)
        self.refs: dict[bytes, int] = {}  # cached block hash -> reference count
        self.evictable: OrderedDict[bytes, None] = OrderedDict()  # ref == 0, oldest first
        self.private_used = 0  # allocated blocks that carry no cache entry

    # --- accounting -------------------------------------------------------------------------------------
    @property
    def cached_blocks(self) -> int:
        return len(self.refs)

    @property
    def used_blocks(self) -> int:
        return self.private_used + len(self.refs) - len(self.evictable)

    @property
    def free_blocks(self) -> int:
        """Blocks an allocation could take now (empty ones plus evictable cached ones)."""
        return self.num_blocks - self.used_blocks

    def usage(self) -> float:
        return self.used_blocks / self.num_blocks

    # --- hashing ----------------------------------------------------------------------------------------
    def block_hashes(
        self, token_ids: Sequence[int], lora: LoraRef | None = None, cache_salt: str | None = None
    ) -> list[bytes]:
        out: list[bytes] = []
        parent = self.none_hash
        bs = self.block_size
        for i in range(len(token_ids) // bs):
            parent = hash_block_tokens(parent, token_ids[i * bs : (i + 1) * bs], self._extra_keys(i, lora, cache_salt))
            out.append(parent)
        return out

    @staticmethod
    def _extra_keys(block: int, lora: LoraRef | None, cache_salt: str | None) -> tuple[Any, ...] | None:
        keys: list[Any] = []
        if lora is not None:
            keys.append(("lora", lora.name, lora.path))
        if cache_salt and block == 0:
            keys.append(("cache_salt", cache_salt))
        return tuple(keys) or None

    @staticmethod
    def _event_extra_keys(block: int, lora: LoraRef | None, cache_salt: str | None) -> tuple[Any, ...] | None:
        """vLLM's `to_event_extra_keys`: the same keys untagged (bare LoRA name, bare salt)."""
        keys: list[Any] = []
        if lora is not None:
            keys.append(lora.name)
        if cache_salt and block == 0:
            keys.append(cache_salt)
        return tuple(keys) or None

    def ext(self, h: bytes) -> int | bytes:
        return to_external(h, self.hash_format)

    # --- lookup / allocate / register / release ---------------------------------------------------------
    def lookup(self, hashes: Sequence[bytes], num_tokens: int) -> int:
        """Number of leading blocks cached; like vLLM, a fully cached prompt still recomputes its last block."""
        if not self.enable_prefix_caching:
            return 0
        n = 0
        for h in hashes:
            if h not in self.refs:
                break
            n += 1
        if n and n * self.block_size >= num_tokens:
            n -= 1
        return n

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def allocate(self, hashes: list[bytes], num_tokens: int, total_tokens: int) -> Allocation:
        """Reserve blocks for a request (prompt `num_tokens`, prompt+output `total_tokens`), or raise NoSpace."""
        hit = self.lookup(hashes, num_tokens)
        need = self.blocks_for(total_tokens) - hit
        # hit blocks that are evictable now are not free for this request's own use
        hit_evictable = sum(1 for h in hashes[:hit] if h in self.evictable)
        if need > self.free_blocks - hit_evictable:
            raise NoSpace
        for h in hashes[:hit]:
            self._ref(h)
        self._take(need)
        return Allocation(hashes=list(hashes), hit_blocks=hit, private_blocks=need)

    def _ref(self, h: bytes) -> None:
        self.refs[h] += 1
        self.evictable.pop(h, None)

    def _take(self, n: int) -> None:
        """Take n blocks: empty ones first, then evict the least recently released cached blocks."""
        empty = self.num_blocks - self.private_used - len(self.refs)
        evict = max(0, n - empty)
        removed: list[KVEvent] = []
        for _ in range(evict):
            h, _ = self.evictable.popitem(last=False)
            del self.refs[h]
            removed.append(BlockRemoved(block_hashes=[self.ext(h)], medium=MEDIUM_GPU, group_idx=0))
        self.private_used += n
        if removed:
            self.emit(removed)

    def register(
        self,
        alloc: Allocation,
        token_ids: Sequence[int],
        lora: LoraRef | None,
        cache_salt: str | None,
        start: int | None = None,
    ) -> None:
        """Prefill done: the request's new full blocks (from `start`, default the first uncached one) enter the
        cache, one BlockStored per run of consecutive new blocks."""
        if not self.enable_prefix_caching or alloc.released:
            return
        events: list[KVEvent] = []
        run: list[int] = []

        def flush() -> None:
            if not run:
                return
            first = run[0]
            parent = self.ext(alloc.hashes[first - 1]) if first > 0 else None
            bs = self.block_size
            extra = [self._event_extra_keys(i, lora, cache_salt) for i in run]
            events.append(
                BlockStored(
                    block_hashes=[self.ext(alloc.hashes[i]) for i in run],
                    parent_block_hash=parent,
                    token_ids=list(token_ids[first * bs : (run[-1] + 1) * bs]),
                    block_size=bs,
                    lora_id=lora.adapter_id if lora else None,
                    medium=MEDIUM_GPU,
                    lora_name=lora.name if lora else None,
                    extra_keys=extra,
                    group_idx=0,
                )
            )
            run.clear()

        for i in range(alloc.hit_blocks if start is None else start, len(alloc.hashes)):
            h = alloc.hashes[i]
            if h in self.refs:  # computed concurrently by another request: ours stays a private duplicate
                flush()
                continue
            # one of this request's private blocks becomes the cache entry
            alloc.private_blocks -= 1
            self.private_used -= 1
            self.refs[h] = 1
            alloc.registered.append(h)
            run.append(i)
        flush()
        if events:
            self.emit(events)

    def extend(
        self, alloc: Allocation, all_token_ids: Sequence[int], lora: LoraRef | None, cache_salt: str | None
    ) -> None:
        """Decode filled the next block (prompt + computed output tokens): it is hashed and cached like vLLM's."""
        if not self.enable_prefix_caching or alloc.released:
            return
        i = len(alloc.hashes)
        bs = self.block_size
        if len(all_token_ids) < (i + 1) * bs:
            return
        parent = alloc.hashes[-1] if alloc.hashes else self.none_hash
        h = hash_block_tokens(parent, all_token_ids[i * bs : (i + 1) * bs], self._extra_keys(i, lora, cache_salt))
        alloc.hashes.append(h)
        self.register(alloc, all_token_ids, lora, cache_salt, start=i)

    def release(self, alloc: Allocation) -> None:
        """Request finished: private blocks are freed, cached ones become evictable (chain tail first)."""
        if alloc.released:
            return
        alloc.released = True
        self.private_used -= alloc.private_blocks
        held = [h for h in alloc.hashes[: alloc.hit_blocks]] + alloc.registered
        for h in reversed(held):
            if h not in self.refs:
                continue  # cleared by reset_prefix_cache meanwhile
            self.refs[h] -= 1
            if self.refs[h] == 0:
                self.evictable[h] = None

    def reset(self) -> bool:
        """vLLM's reset_prefix_cache: only when no block is in use; drops every cached block."""
        if self.used_blocks:
            return False
        self.refs.clear()
        self.evictable.clear()
        self.emit([AllBlocksCleared()])
        return True
