"""Request keys: our own seeded 64-bit chain hash over fixed-size token blocks.

The index is keyed by keys we compute from token ids, never by the engine's hashes, so no alignment with
vLLM's PYTHONHASHSEED or hash algorithm is needed (llm-d's dual-key design). A block's key is
XXH3-64 of the block's tokens (uint32 little-endian) plus its extra keys, seeded with the parent's key;
the root (the seed of block 0) is XXH3-64 of the configured seed and the model (or LoRA) name.
A trailing partial block is dropped: engines only cache full blocks.
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping, Sequence

import xxhash

_xxh = xxhash.xxh3_64_intdigest
_SEP = b"\x00"

DEFAULT_BLOCK_SIZE = 16  # vLLM's default --block-size

ExtraKeys = Sequence[Sequence[str] | None] | None  # per block: strings folded into that block's hash


def _extra_bytes(extra: Sequence[str]) -> bytes:
    """Length-prefixed so ("ab",) and ("a", "b") differ."""
    out = bytearray()
    for s in extra:
        b = s.encode("utf-8", "surrogatepass")
        out += len(b).to_bytes(4, "little")
        out += b
    return bytes(out)


def tokens_to_bytes(tokens: Sequence[int]) -> bytes:
    a = array("I")
    if isinstance(tokens, list):
        a.fromlist(tokens)
    else:
        a.fromlist(list(tokens))
    return a.tobytes()


class TokenProcessor:
    """Tokens → request keys. One instance is shared by the request side and the event side."""

    def __init__(self, block_size: int = DEFAULT_BLOCK_SIZE, hash_seed: str = "") -> None:
        if block_size <= 0:
            raise ValueError(f"blockSize must be positive, got {block_size}")
        self.block_size = block_size
        self.hash_seed = hash_seed
        self._seed = _xxh(hash_seed.encode())
        self._roots: dict[str, int] = {}

    def root(self, model: str) -> int:
        """The parent of block 0 for `model` (a LoRA adapter name when the request used one)."""
        r = self._roots.get(model)
        if r is None:
            r = _xxh(b"model" + _SEP + model.encode("utf-8", "surrogatepass"), self._seed)
            if len(self._roots) < 4096:
                self._roots[model] = r
        return r

    def block_keys(
        self,
        tokens: Sequence[int],
        model: str,
        parent: int | None = None,
        extra: ExtraKeys = None,
        block_size: int | None = None,
    ) -> list[int]:
        """Keys of every full block of `tokens`, chained from `parent` (the model root when None)."""
        bs = block_size or self.block_size
        n = len(tokens) // bs
        if n == 0:
            return []
        buf = tokens_to_bytes(tokens if len(tokens) == n * bs else tokens[: n * bs])
        h = self.root(model) if parent is None else parent
        step = bs * 4
        out = [0] * n
        x = _xxh
        if not extra:
            for i in range(n):
                h = x(buf[i * step : (i + 1) * step], h)
                out[i] = h
            return out
        if len(extra) != n:
            raise ValueError(f"extra keys cover {len(extra)} blocks, tokens fill {n}")
        for i in range(n):
            e = extra[i]
            chunk = buf[i * step : (i + 1) * step]
            h = x(chunk + _SEP + _extra_bytes(e), h) if e else x(chunk, h)
            out[i] = h
        return out


# Models whose block size is learned and kept: a request's model name is the client's, so past this many a learned
# size is answered but not kept (a pool serves a few models and their adapters).
MAX_LEARNED_MODELS = 1024


class BlockSizes:
    """The canonical block size per model: configured, else learned once (from scraped metrics or events).

    A size learned from an event is provisional: an event's word is not a fact. The first size confirmed by a
    pod's scraped `cache_config_info` replaces a provisional one that differs (`learn` then reports the change)."""

    def __init__(self, configured: Mapping[str, int] | None = None, default: int | None = None) -> None:
        self._sizes: dict[str, int] = dict(configured or {})
        self._provisional: set[str] = set()
        self._learned = 0
        self.default = default

    def get(self, model: str) -> int | None:
        return self._sizes.get(model, self.default)

    def any(self) -> int | None:
        """The size to use for a model never seen (e.g. a LoRA adapter of the pool's one base model)."""
        if self.default is not None:
            return self.default
        sizes = set(self._sizes.values())
        return sizes.pop() if len(sizes) == 1 else None

    def provisional(self, model: str) -> bool:
        return model in self._provisional

    def learn(self, model: str, size: int, confirmed: bool = True) -> int:
        """Fix the size for `model` if not yet known (or only provisionally, and `size` is confirmed); returns the
        size in force."""
        cur = self.get(model)
        if cur is not None and size > 0 and confirmed and model in self._provisional:
            self._provisional.discard(model)
            self._sizes[model] = size
            return size
        if cur is None and size > 0:
            if self._learned < MAX_LEARNED_MODELS:
                self._sizes[model] = size
                self._learned += 1
                if not confirmed:
                    self._provisional.add(model)
            return size
        return cur if cur is not None else DEFAULT_BLOCK_SIZE


def request_extra_keys(
    num_blocks: int,
    block_size: int,
    cache_salt: str | None = None,
    mm_items: Sequence[tuple[str, int, int]] = (),
) -> list[list[str] | None] | None:
    """Per-block extra keys for a request, the way vLLM builds them: multimodal identifiers on every block
    their placeholder range (offset, length) overlaps, then cache_salt on block 0 only."""
    if num_blocks == 0 or (not cache_salt and not mm_items):
        return None
    out: list[list[str] | None] = [None] * num_blocks
    for ident, offset, length in mm_items:
        first = offset // block_size
        last = (offset + max(length, 1) - 1) // block_size
        for b in range(max(first, 0), min(last, num_blocks - 1) + 1):
            cur = out[b]
            if cur is None:
                out[b] = [ident]
            else:
                cur.append(ident)
    if cache_salt:
        b0 = out[0]
        if b0 is None:
            out[0] = [cache_salt]
        else:
            b0.append(cache_salt)
    return out
