"""Block hashes computed the way vLLM's prefix cache does (`--prefix-caching-hash-algo sha256_cbor`).

vLLM: `NONE_HASH = sha256_cbor(seed)` (seed = $PYTHONHASHSEED, else "vllm-none-hash"), and each full block's
hash is `sha256_cbor((parent_hash, tuple(token_ids), extra_keys))`; events carry the low 64 bits as an int
(VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1, the default) or the 32 raw bytes. The tiny canonical-CBOR encoder
below covers exactly the types that appear in those tuples.
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Sequence
from typing import Any

DEFAULT_NONE_HASH_SEED = "vllm-none-hash"


def _head(major: int, n: int) -> bytes:
    mt = major << 5
    if n < 24:
        return bytes([mt | n])
    if n < 1 << 8:
        return bytes([mt | 24, n])
    if n < 1 << 16:
        return bytes([mt | 25]) + struct.pack(">H", n)
    if n < 1 << 32:
        return bytes([mt | 26]) + struct.pack(">I", n)
    return bytes([mt | 27]) + struct.pack(">Q", n)


def cbor_dumps(obj: Any) -> bytes:
    """Canonical CBOR (RFC 8949 §4.2 as cbor2's `canonical=True`) for None/bool/int/bytes/str/tuple/list."""
    out = bytearray()
    _enc(obj, out)
    return bytes(out)


def _enc(obj: Any, out: bytearray) -> None:
    if obj is None:
        out.append(0xF6)
    elif obj is True:
        out.append(0xF5)
    elif obj is False:
        out.append(0xF4)
    elif isinstance(obj, int):
        if not -(1 << 64) <= obj < 1 << 64:
            raise ValueError("integer out of CBOR range")
        out += _head(0, obj) if obj >= 0 else _head(1, -1 - obj)
    elif isinstance(obj, bytes | bytearray):
        out += _head(2, len(obj)) + obj
    elif isinstance(obj, str):
        b = obj.encode("utf-8")
        out += _head(3, len(b)) + b
    elif isinstance(obj, tuple | list):
        out += _head(4, len(obj))
        for item in obj:
            _enc(item, out)
    else:
        raise TypeError(f"cannot CBOR-encode {type(obj).__name__}")


def sha256_cbor(obj: Any) -> bytes:
    return hashlib.sha256(cbor_dumps(obj)).digest()


def none_hash(seed: str | None = None) -> bytes:
    """vLLM's NONE_HASH, the parent of every prefix's first block."""
    if seed is None:
        seed = os.environ.get("PYTHONHASHSEED", DEFAULT_NONE_HASH_SEED)
    return sha256_cbor(seed)


def hash_block_tokens(parent: bytes, token_ids: Sequence[int], extra_keys: tuple[Any, ...] | None) -> bytes:
    return sha256_cbor((parent, tuple(token_ids), extra_keys))


def to_external(block_hash: bytes, fmt: str = "int") -> int | bytes:
    """The hash as published in events: low 64 bits big-endian (int mode) or the raw bytes."""
    if fmt == "bytes":
        return block_hash
    return int.from_bytes(block_hash, "big") & ((1 << 64) - 1)
