"""KV-cache events in vLLM's wire shape (`vllm/distributed/kv_events.py`), and their msgpack encodings.

The batch is always vLLM's `EventBatch` array `[ts, events, data_parallel_rank]`. Events are either
positional arrays tagged by their first element (msgspec `array_like=True`, vLLM before #42892, "array")
or maps tagged `type` (vLLM since #42892, "map"). As msgspec does, arrays carry every field (its
`omit_defaults` does not apply to `array_like` structs: the 12/4/1 positions llm-d's adapter reads),
while maps leave out defaulted fields equal to their default.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

MEDIUM_GPU = "GPU"
# vLLM annotates every BlockStored of a KV-cache group with its spec kind (KVCacheManager.take_events); llm-d's
# pool skips a grouped store without one as not prefix-indexable.
FULL_ATTENTION = "full_attention"
BlockHash = int | bytes


@dataclass(frozen=True)
class BlockStored:
    block_hashes: list[BlockHash]
    parent_block_hash: BlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None

    REQUIRED = 7  # leading fields without a default in vLLM's struct: always encoded, even when None


@dataclass(frozen=True)
class BlockRemoved:
    block_hashes: list[BlockHash]
    medium: str | None
    group_idx: int | None = None

    REQUIRED = 2  # (see BlockStored)


@dataclass(frozen=True)
class AllBlocksCleared:
    REQUIRED = 0


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


def _fields(ev: KVEvent) -> list[tuple[str, Any]]:
    return [(name, getattr(ev, name)) for name in ev.__dataclass_fields__ if name != "REQUIRED"]


def event_to_wire(ev: KVEvent, encoding: str) -> Any:
    tag = type(ev).__name__
    fields = _fields(ev)
    required = ev.REQUIRED
    if encoding == "map":
        out: dict[str, Any] = {"type": tag}
        for i, (name, value) in enumerate(fields):
            if i < required or value is not None:
                out[name] = value
        return out
    return [tag, *(v for _, v in fields)]


def encode_batch(ts: float, events: list[KVEvent], data_parallel_rank: int | None, encoding: str) -> bytes:
    body: list[Any] = [ts, [event_to_wire(e, encoding) for e in events]]
    if data_parallel_rank is not None:
        body.append(data_parallel_rank)
    return msgpack.packb(body, use_bin_type=True)
