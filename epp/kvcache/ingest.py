"""Apply decoded KV events of one pod to the index: engine keys → our request keys, tiers, HMA groups.

BlockStored: the parent's request key comes from the pod's engine→request map (an unknown parent skips the
event: the chain cannot be placed; replay fixes the usual cause, a mid-stream join); the tokens are
re-hashed at the canonical block size with the model (or LoRA) root and the extra keys realigned; a store
without tokens is a tier update (e.g. CPU offload) of blocks we already know. BlockRemoved evicts through
the same map. AllBlocksCleared clears the pod. Stores for hybrid-attention groups that are not full
attention are skipped (they do not imply prefix residency), and so are their removals.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from epp.kvcache.events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch
from epp.kvcache.index import Index, tier_index
from epp.kvcache.tokens import BlockSizes, TokenProcessor

log = logging.getLogger(__name__)

FULL_ATTENTION_KINDS = frozenset({"full_attention", "mla_attention", "sink_full_attention"})


@dataclass(slots=True)
class ApplyStats:
    stored_blocks: int = 0
    removed_blocks: int = 0
    clears: int = 0
    skipped_parent: int = 0  # stores whose parent block we never saw
    skipped_group: int = 0  # stores/removals of non-full-attention groups
    unknown_removals: int = 0  # removals of engine keys we do not know
    tier_updates: int = 0

    def add(self, o: ApplyStats) -> None:
        for f in self.__slots__:
            setattr(self, f, getattr(self, f) + getattr(o, f))


def _extra_strings(entry: Any, lora_name: str | None) -> list[str] | None:
    """One engine block's extra keys as strings, in vLLM's order (lora, mm ids, cache_salt, embeds)."""
    if entry is None:
        return None
    items = entry if isinstance(entry, list | tuple) else [entry]
    out: list[str] = []
    for i, it in enumerate(items):
        if isinstance(it, str):
            if i == 0 and lora_name and it == lora_name:
                continue  # the LoRA name is already in the root hash
            out.append(it)
        elif isinstance(it, list | tuple) and it and isinstance(it[0], str):
            out.append(it[0])  # (mm identifier, offset): the offset is positional, already in the chain
        elif isinstance(it, bytes):
            out.append(it.hex())
    return out or None


def realign_extra(engine_extra: Sequence[list[str] | None], n_canonical: int) -> list[list[str] | None] | None:
    """Map per-engine-block extras onto canonical blocks with the same i*len/n rule as the keys."""
    ne = len(engine_extra)
    if n_canonical == 0 or not any(engine_extra):
        return None
    if ne == n_canonical:
        return list(engine_extra)
    out: list[list[str] | None] = [None] * n_canonical
    n = max(ne, n_canonical)
    for i in range(n):
        src = engine_extra[i * ne // n]
        if not src:
            continue
        j = i * n_canonical // n
        cur = out[j]
        if cur is None:
            out[j] = list(src)
        else:
            cur.extend(s for s in src if s not in cur)
    return out


class EventApplier:
    """Turns one pod's event batches into index writes. Shared by all pool workers (single event loop)."""

    def __init__(self, index: Index, tokens: TokenProcessor, block_sizes: BlockSizes | None = None) -> None:
        self.index = index
        self.tokens = tokens
        self.block_sizes = block_sizes or BlockSizes(default=tokens.block_size)
        self._groups: dict[tuple[str, int], bool] = {}  # (pod, group) -> indexable
        self._warned: set[str] = set()

    def canonical_block_size(self, model: str, engine_block_size: int = 0) -> int:
        return self.block_sizes.learn(model, engine_block_size)

    def apply(self, pod: str, model: str, batch: EventBatch) -> ApplyStats:
        st = ApplyStats()
        for ev in batch.events:
            if type(ev) is BlockStored:
                self._stored(pod, model, ev, st)
            elif type(ev) is BlockRemoved:
                if ev.group_idx is not None and not self._groups.get((pod, ev.group_idx), True):
                    st.skipped_group += 1
                    continue
                n = len(ev.block_hashes)
                unknown = self.index.evict(ev.block_hashes, pod, tier_index(ev.medium))
                st.unknown_removals += unknown
                st.removed_blocks += n - unknown
            elif type(ev) is AllBlocksCleared:
                self.clear_pod(pod)
                st.clears += 1
        return st

    def clear_pod(self, pod: str) -> None:
        self.index.clear_pod(pod)
        for k in [k for k in self._groups if k[0] == pod]:
            del self._groups[k]

    def _stored(self, pod: str, model: str, ev: BlockStored, st: ApplyStats) -> None:
        tier = tier_index(ev.medium)
        hashes = ev.block_hashes
        tokens = ev.token_ids
        if ev.group_idx is not None:
            ok = ev.spec_kind is None or ev.spec_kind in FULL_ATTENTION_KINDS
            if ev.spec_kind is not None:
                self._groups[(pod, ev.group_idx)] = ok
            dense = not tokens or (len(tokens) % ev.block_size == 0 and len(tokens) // ev.block_size == len(hashes))
            if not ok or not dense:
                st.skipped_group += 1
                return
        if not tokens:  # tier update: blocks we know moved to / were copied into another tier
            idx = self.index
            for e in hashes:
                rs = idx.engine_request_keys(pod, e)
                if rs:
                    idx.add(None, rs, pod, tier)
            st.tier_updates += 1
            return
        parent: int | None = None
        if ev.parent is not None:
            parent = self.index.request_key(pod, ev.parent)
            if parent is None:
                st.skipped_parent += 1
                return
        eff_model = ev.lora_name or model
        bs = self.block_sizes.learn(model, ev.block_size)
        if bs > ev.block_size and "bs" not in self._warned:
            self._warned.add("bs")
            log.warning(
                "canonical block size %d exceeds the engine's %d for %s: stores that do not start on a "
                "canonical boundary cannot be placed; use a block size that divides the engine's",
                bs,
                ev.block_size,
                model,
            )
        extra = None
        if ev.extra_keys:
            per_engine = [_extra_strings(x, ev.lora_name) for x in ev.extra_keys[: len(hashes)]]
            extra = realign_extra(per_engine, len(tokens) // bs)
        keys = self.tokens.block_keys(tokens, eff_model, parent, extra, block_size=bs)
        if keys:
            self.index.add(hashes, keys, pod, tier)
            st.stored_blocks += len(hashes)
