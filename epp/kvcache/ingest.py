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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from epp.framework.logthrottle import LogThrottle
from epp.kvcache.events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch
from epp.kvcache.index import Index, tier_index
from epp.kvcache.metrics import IndexMetrics
from epp.kvcache.tokens import BlockSizes, TokenProcessor
from epp.kvcache.validation import EventGuard

log = logging.getLogger(__name__)
_throttle = LogThrottle()
# Blocks applied between two yields to the event loop: one engine batch can carry 100k+ blocks (a long prompt's
# prefill, a CPU-offload sweep), ~0.6 s of work at 131,072 blocks, which requests must not wait behind.
SLICE_BLOCKS = 512


def slice_batch(batch: EventBatch, max_blocks: int = SLICE_BLOCKS) -> Iterator[EventBatch]:
    """`batch` as consecutive batches of at most ~`max_blocks` blocks each, same result when applied in order.

    A BlockStored is cut on engine-block boundaries, each piece chained to the previous one by its last engine
    hash (which the previous piece's apply has mapped), so the request keys come out as for the whole event;
    stores whose tokens are not exactly block_size per hash, and everything else, are not cut.
    """
    out: list[Any] = []
    n = 0
    for ev in batch.events:
        if isinstance(ev, BlockStored) and len(ev.block_hashes) > max_blocks and _cuttable(ev):
            bs = ev.block_size
            for i in range(0, len(ev.block_hashes), max_blocks):
                j = i + max_blocks
                piece = replace(
                    ev,
                    block_hashes=ev.block_hashes[i:j],
                    parent=ev.parent if i == 0 else ev.block_hashes[i - 1],
                    token_ids=ev.token_ids[i * bs : j * bs] if ev.token_ids else ev.token_ids,
                    extra_keys=ev.extra_keys[i:j] if ev.extra_keys else ev.extra_keys,
                )
                if out:
                    yield replace(batch, events=out, unknown=0)
                    out, n = [], 0
                out.append(piece)
                n = len(piece.block_hashes)
            continue
        if isinstance(ev, BlockRemoved) and len(ev.block_hashes) > max_blocks:
            for i in range(0, len(ev.block_hashes), max_blocks):
                if out:
                    yield replace(batch, events=out, unknown=0)
                    out, n = [], 0
                out.append(replace(ev, block_hashes=ev.block_hashes[i : i + max_blocks]))
                n = max_blocks
            continue
        size = len(ev.block_hashes) if isinstance(ev, BlockStored | BlockRemoved) else 1
        if out and n + size > max_blocks:
            yield replace(batch, events=out, unknown=0)
            out, n = [], 0
        out.append(ev)
        n += size
    yield replace(batch, events=out)  # the last piece carries the batch's count of unknown events


# Items freed between two yields when a batch's long lists are let go (about a millisecond's worth).
RELEASE_STEP = 65_536


def long_lists(ev: object) -> list[list[Any]]:
    """The event's lists longer than RELEASE_STEP (token ids, block hashes), to be emptied a step at a time."""
    if isinstance(ev, BlockStored):
        lists: list[list[Any]] = [ev.token_ids, ev.block_hashes]
        if ev.extra_keys:
            lists.append(ev.extra_keys)
    elif isinstance(ev, BlockRemoved):
        lists = [ev.block_hashes]
    else:
        return []
    return [x for x in lists if isinstance(x, list) and len(x) > RELEASE_STEP]


def _cuttable(ev: BlockStored) -> bool:
    tokens = ev.token_ids
    return not tokens or (ev.block_size > 0 and len(tokens) == ev.block_size * len(ev.block_hashes))


FULL_ATTENTION_KINDS = frozenset({"full_attention", "mla_attention", "sink_full_attention"})


@dataclass(slots=True)
class ApplyStats:
    stored_blocks: int = 0
    removed_blocks: int = 0
    clears: int = 0
    skipped_parent: int = 0  # stores whose parent block we never saw
    skipped_group: int = 0  # stores/removals of non-full-attention groups
    bad_events: int = 0  # events whose fields decoded but could not be applied (e.g. token ids out of range)
    unknown_removals: int = 0  # removals of engine keys we do not know
    tier_updates: int = 0
    # stores refused by the EventGuard (epp.kvcache.validation), by reason
    refused_block_size: int = 0
    refused_hashes: int = 0
    refused_budget: int = 0
    refused_rate: int = 0

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

    def __init__(
        self,
        index: Index,
        tokens: TokenProcessor,
        block_sizes: BlockSizes | None = None,
        guard: EventGuard | None = None,
    ) -> None:
        self.index = index
        self.guard = guard or EventGuard()
        self.index_metrics: IndexMetrics | None = None  # enableMetrics: admissions and evictions counted here
        self._model_pods: dict[str, set[str]] = {}  # model -> pods whose stores were keyed at its block size
        self.tokens = tokens
        self.block_sizes = block_sizes or BlockSizes(default=tokens.block_size)
        self._groups: dict[tuple[str, int], bool] = {}  # (pod, group) -> indexable
        self._warned: set[str] = set()
        # Pods whose events have stored blocks in the index (until they leave the pool): the others are routed on
        # the precise producer's approximate fallback, if it has one.
        self.publishing: set[str] = set()
        self.on_forget: Callable[[str], None] | None = None  # told when a pod leaves (the delivered-hits windows)

    def canonical_block_size(self, model: str, engine_block_size: int = 0) -> int:
        return self.block_sizes.learn(model, engine_block_size)

    def apply(self, pod: str, model: str, batch: EventBatch) -> ApplyStats:
        st = ApplyStats()
        for ev in batch.events:
            try:
                self._apply_one(pod, model, ev, st)
            except (TypeError, ValueError, OverflowError) as e:
                st.bad_events += 1
                _throttle.log(
                    log, logging.WARNING, "bad_event", "KV events: skipping a bad %s from %s: %s",
                    type(ev).__name__, pod, e,
                )  # fmt: skip
        if st.stored_blocks:
            self.publishing.add(pod)
        return st

    def forget(self, pod: str) -> None:
        """The pod left the pool: its blocks go, and it counts as publishing again only once new events arrive."""
        self.clear_pod(pod)
        self.guard.forget(pod)
        for pods in self._model_pods.values():
            pods.discard(pod)
        self.publishing.discard(pod)
        if self.on_forget is not None:
            self.on_forget(pod)

    def _apply_one(self, pod: str, model: str, ev: object, st: ApplyStats) -> None:
        if isinstance(ev, BlockStored):
            self._stored(pod, model, ev, st)
        elif isinstance(ev, BlockRemoved):
            if ev.group_idx is not None and not self._groups.get((pod, ev.group_idx), True):
                st.skipped_group += 1
                return
            n = len(ev.block_hashes)
            unknown = self.index.evict(ev.block_hashes, pod, tier_index(ev.medium))
            if self.index_metrics is not None:
                self.index_metrics.add(self.index_metrics.evictions, n - unknown)
            st.unknown_removals += unknown
            st.removed_blocks += n - unknown
            self.guard.removed(pod, n - unknown)
        elif isinstance(ev, AllBlocksCleared):
            self.clear_pod(pod)
            st.clears += 1

    def clear_pod(self, pod: str) -> None:
        self.index.clear_pod(pod)
        self.guard.cleared(pod)
        for k in [k for k in self._groups if k[0] == pod]:
            del self._groups[k]

    def _stored(self, pod: str, model: str, ev: BlockStored, st: ApplyStats) -> None:
        tier = tier_index(ev.medium)
        hashes = ev.block_hashes
        tokens = ev.token_ids
        refused = self.guard.check_store(pod, ev.group_idx, tier, ev.block_size, len(hashes), len(tokens))
        if refused is not None:
            self._refuse(pod, model, ev, refused, st)
            return
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
        bs = self._block_size(pod, model, ev.block_size)
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
            if self.index_metrics is not None:
                self.index_metrics.add(self.index_metrics.admissions, len(keys))
            st.stored_blocks += len(hashes)
            self.guard.stored(pod, len(hashes))

    def _block_size(self, pod: str, model: str, engine_bs: int) -> int:
        """The model's canonical size, learned from this store if not yet known. A size the pod's scraped metrics
        confirm replaces a provisional one learned from an earlier event: the pods keyed at that one are cleared."""
        sizes = self.block_sizes
        before, provisional = sizes.get(model), sizes.provisional(model)
        bs = sizes.learn(model, engine_bs, confirmed=self.guard.confirmed(pod, engine_bs))
        pods = self._model_pods.setdefault(model, set()) if len(self._model_pods) < 4096 else set()
        if provisional and before is not None and bs != before:
            log.warning(
                "KV events: %s's engine block size %d (scraped) replaces %d, learned from an earlier event; "
                "clearing the %d pod(s) keyed at %d",
                pod, bs, before, len(pods), before,
            )  # fmt: skip
            for p in list(pods):
                self.clear_pod(p)
            pods.clear()
        pods.add(pod)
        return bs

    _REFUSED = {
        "block_size": "refused_block_size",
        "too_many_hashes": "refused_hashes",
        "pod_budget": "refused_budget",
        "rate": "refused_rate",
    }

    def _refuse(self, pod: str, model: str, ev: BlockStored, reason: str, st: ApplyStats) -> None:
        field_ = self._REFUSED[reason]
        setattr(st, field_, getattr(st, field_) + 1)
        _throttle.log(
            log, logging.WARNING, "refused_" + reason,
            "KV events: refusing a BlockStored from %s (%s): %s (block_size %d, %d hashes, %d tokens; the pod's "
            "scraped block size %d, %d blocks indexed)",
            pod, model, reason, ev.block_size, len(ev.block_hashes), len(ev.token_ids),
            self.guard.scraped_block_size(pod), self.guard.blocks(pod),
        )  # fmt: skip
