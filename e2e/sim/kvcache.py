"""A vLLM-like paged KV cache: fixed capacity in blocks, prefix reuse by chained block hashes, LRU eviction.

Only full blocks are hashed and cached (as in vLLM). A physical block is free, held by running requests
(ref > 0), or cached and unreferenced (evictable, oldest release first; a request's blocks are released
tail-first so a chain is evicted from its end, like vLLM's free queue). As in vLLM's BlockPool, two
requests that compute the same block at the same time (or a fully cached prompt whose last block is
recomputed) give two physical blocks with one hash: each is announced by BlockStored and each eviction
by BlockRemoved, which is why consumers (llm-d) reference-count announcements. Every change is turned
into a BlockStored / BlockRemoved / AllBlocksCleared event handed to `emit`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from e2e.sim.events import FULL_ATTENTION, MEDIUM_GPU, AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from e2e.sim.hashing import hash_block_tokens, none_hash, to_external


def mm_block_keys(mm: Sequence[tuple[str, int, int]], start: int, end: int) -> list[tuple[str, str, int]]:
    """vLLM's `_gen_mm_extra_hash_keys` for the block [start, end): every multimodal item (hash, offset, length)
    overlapping it, as ("mm", hash, its offset relative to the block's start)."""
    return [("mm", h, off - start) for h, off, n in mm if off < end and off + n > start]


@dataclass
class LoraRef:
    name: str
    path: str
    adapter_id: int


@dataclass(eq=False)
class Block:
    """One physical block holding a cache entry."""

    hash: bytes
    ref: int = 0
    cached: bool = True  # False once evicted or cleared


@dataclass
class Allocation:
    """The blocks one request holds: cached prefix blocks it reused, new cached blocks, and private ones."""

    hashes: list[bytes]  # full-block hashes of the request's tokens (cached or not)
    hit: list[Block]  # leading blocks found in the cache (ref'd)
    private_blocks: int  # reserved blocks not (yet) holding a cache entry
    registered: list[Block] = field(default_factory=list)  # blocks this request put in the cache (ref'd)
    released: bool = False
    mm: tuple[tuple[str, int, int], ...] = ()  # the prompt's multimodal items (hash, offset, length)

    @property
    def hit_blocks(self) -> int:
        return len(self.hit)


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
        self.by_hash: dict[bytes, list[Block]] = {}  # hash -> physical blocks holding it
        self.num_cached = 0  # physical blocks holding a cache entry
        self.evictable: OrderedDict[int, Block] = OrderedDict()  # id(block) -> block with ref 0, oldest first
        self.private_used = 0  # allocated blocks that carry no cache entry

    # --- accounting -------------------------------------------------------------------------------------
    @property
    def cached_blocks(self) -> int:
        return self.num_cached

    @property
    def used_blocks(self) -> int:
        return self.private_used + self.num_cached - len(self.evictable)

    @property
    def free_blocks(self) -> int:
        """Blocks an allocation could take now (empty ones plus evictable cached ones)."""
        return self.num_blocks - self.used_blocks

    def usage(self) -> float:
        return self.used_blocks / self.num_blocks

    # --- hashing ----------------------------------------------------------------------------------------
    def block_hashes(
        self,
        token_ids: Sequence[int],
        lora: LoraRef | None = None,
        cache_salt: str | None = None,
        mm: Sequence[tuple[str, int, int]] = (),
    ) -> list[bytes]:
        out: list[bytes] = []
        parent = self.none_hash
        bs = self.block_size
        for i in range(len(token_ids) // bs):
            extra = self._extra_keys(i, lora, cache_salt, mm_block_keys(mm, i * bs, (i + 1) * bs) if mm else ())
            parent = hash_block_tokens(parent, token_ids[i * bs : (i + 1) * bs], extra)
            out.append(parent)
        return out

    @staticmethod
    def _extra_keys(
        block: int, lora: LoraRef | None, cache_salt: str | None, mm_keys: Sequence[tuple[Any, ...]] = ()
    ) -> tuple[Any, ...] | None:
        """vLLM's order: lora, multimodal items, cache_salt (block 0)."""
        keys: list[Any] = []
        if lora is not None:
            keys.append(("lora", lora.name, lora.path))
        keys.extend(mm_keys)
        if cache_salt and block == 0:
            keys.append(("cache_salt", cache_salt))
        return tuple(keys) or None

    @staticmethod
    def _event_extra_keys(
        block: int, lora: LoraRef | None, cache_salt: str | None, mm_keys: Sequence[tuple[Any, ...]] = ()
    ) -> tuple[Any, ...] | None:
        """vLLM's `to_event_extra_keys`: the same keys untagged (bare LoRA name, (mm hash, offset), bare salt)."""
        keys: list[Any] = []
        if lora is not None:
            keys.append(lora.name)
        keys.extend(tuple(k[1:]) for k in mm_keys)
        if cache_salt and block == 0:
            keys.append(cache_salt)
        return tuple(keys) or None

    def ext(self, h: bytes) -> int | bytes:
        return to_external(h, self.hash_format)

    # --- lookup / allocate / register / release ---------------------------------------------------------
    def lookup(self, hashes: Sequence[bytes], num_tokens: int) -> int:
        """Number of leading blocks cached. Like vLLM, at most num_tokens - 1 tokens hit (one is always computed)."""
        if not self.enable_prefix_caching:
            return 0
        n = 0
        limit = max(0, (num_tokens - 1) // self.block_size)
        for h in hashes[:limit]:
            if h not in self.by_hash:
                break
            n += 1
        return n

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _pick(self, h: bytes) -> Block:
        """The physical block to reuse for a hit: one in use if any (keeps evictable copies evictable)."""
        blocks = self.by_hash[h]
        return next((b for b in blocks if b.ref > 0), blocks[0])

    def allocate(self, hashes: list[bytes], num_tokens: int, total_tokens: int) -> Allocation:
        """Reserve blocks for a request (prompt `num_tokens`, prompt+output `total_tokens`), or raise NoSpace."""
        hit = [self._pick(h) for h in hashes[: self.lookup(hashes, num_tokens)]]
        need = self.blocks_for(total_tokens) - len(hit)
        hit_evictable = sum(1 for b in hit if b.ref == 0)  # about to be held: no longer free for this request
        if need > self.free_blocks - hit_evictable:
            raise NoSpace
        for b in hit:
            b.ref += 1
            self.evictable.pop(id(b), None)
        self._take(need)
        return Allocation(hashes=list(hashes), hit=hit, private_blocks=need)

    def _take(self, n: int) -> None:
        """Take n blocks: empty ones first, then evict the least recently released cached blocks."""
        empty = self.num_blocks - self.private_used - self.num_cached
        removed: list[KVEvent] = []
        for _ in range(max(0, n - empty)):
            _, b = self.evictable.popitem(last=False)
            self._uncache(b)
            removed.append(BlockRemoved(block_hashes=[self.ext(b.hash)], medium=MEDIUM_GPU, group_idx=0))
        self.private_used += n
        if removed:
            self.emit(removed)

    def _uncache(self, b: Block) -> None:
        b.cached = False
        self.num_cached -= 1
        copies = self.by_hash[b.hash]
        copies.remove(b)
        if not copies:
            del self.by_hash[b.hash]

    def extend_hit(self, alloc: Allocation, num_tokens: int) -> None:
        """Leading blocks cached since the allocation (a request ahead of this one computed them) become hits,
        freeing as many reserved blocks: vLLM looks the prefix up when it schedules the request's prefill."""
        if not self.enable_prefix_caching or alloc.released or alloc.registered:
            return
        for h in alloc.hashes[alloc.hit_blocks : self.lookup(alloc.hashes, num_tokens)]:
            b = self._pick(h)
            b.ref += 1
            self.evictable.pop(id(b), None)
            alloc.hit.append(b)
            alloc.private_blocks -= 1
            self.private_used -= 1

    def register(
        self,
        alloc: Allocation,
        token_ids: Sequence[int],
        lora: LoraRef | None,
        cache_salt: str | None,
        start: int | None = None,
    ) -> None:
        """Blocks computed: the request's new full blocks (from `start`, default the first not hit) enter the
        cache, announced by one BlockStored (vLLM's `cache_full_blocks`), duplicates of existing hashes included."""
        if not self.enable_prefix_caching or alloc.released:
            return
        first = alloc.hit_blocks if start is None else start
        new = range(first, len(alloc.hashes))
        if not new:
            return
        for i in new:
            b = Block(alloc.hashes[i], ref=1)
            self.by_hash.setdefault(b.hash, []).append(b)
            self.num_cached += 1
            alloc.private_blocks -= 1
            self.private_used -= 1
            alloc.registered.append(b)
        bs = self.block_size
        self.emit(
            [
                BlockStored(
                    block_hashes=[self.ext(alloc.hashes[i]) for i in new],
                    parent_block_hash=self.ext(alloc.hashes[first - 1]) if first > 0 else None,
                    token_ids=list(token_ids[first * bs : len(alloc.hashes) * bs]),
                    block_size=bs,
                    lora_id=lora.adapter_id if lora else None,
                    medium=MEDIUM_GPU,
                    lora_name=lora.name if lora else None,
                    extra_keys=[
                        self._event_extra_keys(i, lora, cache_salt, mm_block_keys(alloc.mm, i * bs, (i + 1) * bs))
                        for i in new
                    ],
                    group_idx=0,
                    kv_cache_spec_kind=FULL_ATTENTION,
                )
            ]
        )

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
        extra = self._extra_keys(i, lora, cache_salt, mm_block_keys(alloc.mm, i * bs, (i + 1) * bs))
        alloc.hashes.append(hash_block_tokens(parent, all_token_ids[i * bs : (i + 1) * bs], extra))
        self.register(alloc, all_token_ids, lora, cache_salt, start=i)

    def release(self, alloc: Allocation) -> None:
        """Request finished: private blocks are freed, cached ones become evictable (chain tail first)."""
        if alloc.released:
            return
        alloc.released = True
        self.private_used -= alloc.private_blocks
        for b in reversed(alloc.hit + alloc.registered):
            b.ref -= 1
            if b.ref == 0 and b.cached:
                self.evictable[id(b)] = b

    def reset(self) -> bool:
        """vLLM's reset_prefix_cache: only when no block is in use; drops every cached block."""
        if self.used_blocks:
            return False
        for blocks in self.by_hash.values():
            for b in blocks:
                b.cached = False
        self.by_hash.clear()
        self.evictable.clear()
        self.num_cached = 0
        self.emit([AllBlocksCleared()])
        return True
