"""KV-cache events and their wire decoders (vLLM and SGLang; msgpack).

vLLM encodes a batch as `[ts, events, dp_rank]` (msgspec array_like) and, since #42892, each event as a map
tagged `{"type": "BlockStored", ...}`; older vLLM and SGLang encode events positionally
(`["BlockStored", hashes, parent, tokens, block_size, lora_id, medium, lora_name, extra_keys, group_idx, ...]`).
Both are accepted at both levels, and every field is length/type guarded: a malformed batch raises
DecodeError (the caller counts and drops it), it never corrupts the index.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgpack

MASK64 = (1 << 64) - 1
MAX_TS = 1e11  # seconds since the epoch (year 5138): a batch's `ts` beyond it, negative or NaN is not a time
MAX_RANK = 1 << 16  # data-parallel ranks are small integers


class DecodeError(ValueError):
    """The payload is not a KV event batch we understand."""


@dataclass(slots=True)
class BlockStored:
    block_hashes: list[int]
    parent: int | None
    token_ids: list[int]
    block_size: int
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None
    spec_kind: str | None = None


@dataclass(slots=True)
class BlockRemoved:
    block_hashes: list[int]
    medium: str | None = None
    group_idx: int | None = None


@dataclass(slots=True)
class AllBlocksCleared:
    pass


Event = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(slots=True)
class EventBatch:
    ts: float
    events: list[Event]
    dp_rank: int | None = None
    unknown: int = 0  # events with a tag we do not know (skipped, counted)


def block_hash(v: Any) -> int:
    """An engine block hash as uint64: ints are masked, bytes give their last 8 bytes big-endian."""
    if type(v) is int:
        return v & MASK64
    if isinstance(v, bytes | bytearray):
        if not v:
            raise DecodeError("empty block hash")
        return int.from_bytes(v[-8:], "big")
    raise DecodeError(f"block hash must be int or bytes, got {type(v).__name__}")


class _Masked(list[int]):
    """A block-hash list already masked a step at a time (`mask_steps`): taken as it is. msgpack never makes one."""


def _hashes(v: Any) -> list[int]:
    if type(v) is _Masked:
        return v
    if not isinstance(v, list):
        raise DecodeError("block_hashes must be a list")
    try:
        return [h & MASK64 for h in v]
    except TypeError:
        return [block_hash(h) for h in v]


def _tokens(v: Any) -> list[int]:
    if v is None:
        return []
    if not isinstance(v, list):
        raise DecodeError("token_ids must be a list")
    return v


def _opt_str(v: Any, what: str) -> str | None:
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    raise DecodeError(f"{what} must be a string")


def _opt_int(v: Any, what: str) -> int | None:
    if v is None or type(v) is int:
        return v
    raise DecodeError(f"{what} must be an integer")


def _at(a: list[Any], i: int) -> Any:
    return a[i] if len(a) > i else None


def _stored_positional(a: list[Any]) -> BlockStored:
    # [tag, hashes, parent, tokens, block_size, lora_id, medium, lora_name, extra_keys, group_idx, kind, sw]
    if len(a) < 5:
        raise DecodeError(f"BlockStored needs at least 5 fields, got {len(a)}")
    bs = a[4]
    if type(bs) is not int or bs <= 0:
        raise DecodeError("BlockStored.block_size must be a positive integer")
    parent = a[2]
    return BlockStored(
        block_hashes=_hashes(a[1]),
        parent=None if parent is None else block_hash(parent),
        token_ids=_tokens(a[3]),
        block_size=bs,
        medium=_opt_str(_at(a, 6), "medium"),
        lora_name=_opt_str(_at(a, 7), "lora_name"),
        extra_keys=_at(a, 8) if isinstance(_at(a, 8), list) else None,
        group_idx=_opt_int(_at(a, 9), "group_idx"),
        spec_kind=_opt_str(_at(a, 10), "kv_cache_spec_kind"),
    )


def _stored_map(m: dict[str, Any]) -> BlockStored:
    bs = m.get("block_size")
    if type(bs) is not int or bs <= 0:
        raise DecodeError("BlockStored.block_size must be a positive integer")
    if "block_hashes" not in m:
        raise DecodeError("BlockStored without block_hashes")
    parent = m.get("parent_block_hash")
    ek = m.get("extra_keys")
    return BlockStored(
        block_hashes=_hashes(m["block_hashes"]),
        parent=None if parent is None else block_hash(parent),
        token_ids=_tokens(m.get("token_ids")),
        block_size=bs,
        medium=_opt_str(m.get("medium"), "medium"),
        lora_name=_opt_str(m.get("lora_name"), "lora_name"),
        extra_keys=ek if isinstance(ek, list) else None,
        group_idx=_opt_int(m.get("group_idx"), "group_idx"),
        spec_kind=_opt_str(m.get("kv_cache_spec_kind"), "kv_cache_spec_kind"),
    )


def _removed_positional(a: list[Any]) -> BlockRemoved:
    if len(a) < 2:
        raise DecodeError("BlockRemoved needs block_hashes")
    return BlockRemoved(_hashes(a[1]), _opt_str(_at(a, 2), "medium"), _opt_int(_at(a, 3), "group_idx"))


def _removed_map(m: dict[str, Any]) -> BlockRemoved:
    if "block_hashes" not in m:
        raise DecodeError("BlockRemoved without block_hashes")
    return BlockRemoved(
        _hashes(m["block_hashes"]), _opt_str(m.get("medium"), "medium"), _opt_int(m.get("group_idx"), "group_idx")
    )


_CLEARED = AllBlocksCleared()


def decode_event(raw: Any) -> Event | None:
    """One event, positional or map-encoded; None for an unknown tag."""
    if isinstance(raw, list):
        if not raw:
            raise DecodeError("empty event")
        tag = raw[0]
        if tag == "BlockStored":
            return _stored_positional(raw)
        if tag == "BlockRemoved":
            return _removed_positional(raw)
        if tag == "AllBlocksCleared":
            return _CLEARED
        if not isinstance(tag, str):
            raise DecodeError("event tag must be a string")
        return None
    if isinstance(raw, dict):
        tag = raw.get("type")
        if tag == "BlockStored":
            return _stored_map(raw)
        if tag == "BlockRemoved":
            return _removed_map(raw)
        if tag == "AllBlocksCleared":
            return _CLEARED
        if not isinstance(tag, str):
            raise DecodeError("event map without a string 'type'")
        return None
    raise DecodeError(f"event must be an array or a map, got {type(raw).__name__}")


def decode_batch(payload: bytes) -> EventBatch:
    """A vLLM or SGLang event batch: `[ts, events, dp_rank?]` or `{"ts", "events", "data_parallel_rank"}`."""
    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as e:  # msgpack raises several types (ExtraData, FormatError, ValueError, ...)
        raise DecodeError(f"invalid msgpack: {e}") from None
    return batch_from_raw(raw)


# Payloads above this are unpacked a step at a time (`unpack_steps`); below it one `unpackb` takes < ~1 ms.
STEP_BYTES = 64 * 1024


def unpack_steps(payload: bytes, step: int = STEP_BYTES) -> Iterator[Any]:
    """Unpack `payload` (one msgpack object, as `unpackb` would) `step` bytes at a time: msgpack's Unpacker resumes
    a partly fed object where it stopped, so each step costs about step/len of the whole decode. Yields None after
    each step that did not finish the object, then the object; raises DecodeError like `decode_batch`."""
    n = len(payload)
    u = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=max(n, 1))
    mv = memoryview(payload)
    for i in range(0, n, step):
        try:
            u.feed(mv[i : i + step])
            obj = u.unpack()
        except msgpack.OutOfData:
            yield None
            continue
        except Exception as e:  # msgpack raises several types (FormatError, StackError, ValueError, ...)
            raise DecodeError(f"invalid msgpack: {e}") from None
        if u.tell() != n:
            raise DecodeError("invalid msgpack: extra data after the batch")
        yield obj
        return
    raise DecodeError("invalid msgpack: truncated batch")


# Block hashes masked between two yields by `mask_steps` (~0.5 ms of work on a slow core).
MASK_STEP = 16_384


def mask_steps(raw: Any) -> Iterator[None]:
    """Mask the long block-hash lists of an unpacked batch in place, `MASK_STEP` hashes at a time, yielding after
    each step (and after each step of letting the raw list go): `batch_from_raw` then takes them as they are, and a
    huge store does not hold the loop while it is masked. Anything malformed is left for `batch_from_raw` to refuse."""
    events = raw[1] if isinstance(raw, list) and len(raw) >= 2 else raw.get("events") if isinstance(raw, dict) else None
    if not isinstance(events, list):
        return
    for ev in events:
        if isinstance(ev, list) and len(ev) >= 2 and ev[0] in ("BlockStored", "BlockRemoved"):
            key: Any = 1
        elif isinstance(ev, dict) and ev.get("type") in ("BlockStored", "BlockRemoved"):
            key = "block_hashes"
            if key not in ev:
                continue
        else:
            continue
        hashes = ev[key]
        if not isinstance(hashes, list) or len(hashes) <= MASK_STEP:
            continue
        out = _Masked()
        for i in range(0, len(hashes), MASK_STEP):
            out.extend(_hashes(hashes[i : i + MASK_STEP]))
            yield None
        ev[key] = out
        while hashes:  # freeing 100k+ ints at once is a stall of its own
            del hashes[-MASK_STEP:]
            yield None


def batch_from_raw(raw: Any) -> EventBatch:
    """The batch from its unpacked msgpack object."""
    if isinstance(raw, list):
        if len(raw) < 2:
            raise DecodeError("event batch needs [ts, events]")
        ts, events, rank = raw[0], raw[1], _at(raw, 2)
    elif isinstance(raw, dict):
        ts, events = raw.get("ts", 0.0), raw.get("events")
        rank = raw.get("data_parallel_rank", raw.get("attn_dp_rank"))
    else:
        raise DecodeError(f"event batch must be an array or a map, got {type(raw).__name__}")
    if not isinstance(events, list):
        raise DecodeError("event batch 'events' must be a list")
    if isinstance(ts, bool) or not isinstance(ts, int | float):
        raise DecodeError("event batch 'ts' must be a number")
    if not 0 <= ts <= MAX_TS:
        raise DecodeError(f"event batch 'ts' {ts!r} is not a time (want 0 to {MAX_TS:.0f} seconds since the epoch)")
    out: list[Event] = []
    unknown = 0
    for raw_ev in events:
        ev = decode_event(raw_ev)
        if ev is None:
            unknown += 1
        else:
            out.append(ev)
    dp_rank = _opt_int(rank, "data_parallel_rank")
    if dp_rank is not None and not 0 <= dp_rank < MAX_RANK:
        raise DecodeError(f"event batch data_parallel_rank {dp_rank} out of range")
    return EventBatch(float(ts), out, dp_rank, unknown)


def parse_topic(topic: bytes) -> tuple[str, str]:
    """`kv@<pod-id>@<model>` → (pod id, model). The model may itself contain `@`; other shapes give ("", "")."""
    t = topic.decode("utf-8", "replace")
    parts = t.split("@", 2)
    if len(parts) == 3:
        return parts[1], parts[2]
    return "", ""
