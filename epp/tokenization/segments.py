"""Incremental encoding of chat prompts: one added-token-delimited segment at a time, with a segment cache.

A Hugging Face tokenizer extracts its added tokens (`<|im_start|>`, `<|im_end|>`, ...) from the text before it
normalizes and pre-tokenizes, and encodes every piece between them on its own. So the ids of a text are the
concatenation of the ids of its pieces split at added tokens, and a chat template puts added tokens between
messages: a multi-turn conversation only needs its new messages encoded, the earlier ones come from the cache.
Tokenizers whose added tokens strip neighbouring whitespace or match single words only break that equivalence;
for them (and when a probe disagrees with the whole-text encoding) the encoder is off and encodes whole texts.
"""

from __future__ import annotations

import logging
import re
from collections import OrderedDict
from typing import Any

log = logging.getLogger(__name__)

_PROBE = "<s> a\n  b\t\nc 'll  x"


class SegmentEncoder:
    """`encode(text)` == `tok(text, add_special_tokens=False)["input_ids"]`, reusing cached segments."""

    MIN_CACHED_CHARS = 64  # shorter pieces are cheaper to encode than to look up and hold

    def __init__(self, tok: Any, max_chars: int = 32 << 20) -> None:
        self._tok = tok
        self._raw = getattr(tok, "backend_tokenizer", None)
        self.max_chars = max_chars
        self._cache: OrderedDict[str, list[int]] = OrderedDict()
        self._chars = 0
        self.hits = 0
        self.misses = 0
        added = list(getattr(tok, "added_tokens_decoder", {}).values())
        self._ids = {t.content: tok.convert_tokens_to_ids(t.content) for t in added}
        exact = all(not (t.lstrip or t.rstrip or t.single_word) for t in added)
        self.enabled = bool(self._raw is not None and added and exact)
        self._split = (
            re.compile("(" + "|".join(re.escape(c) for c in sorted(self._ids, key=len, reverse=True)) + ")")
            if self._ids
            else None
        )
        if self.enabled:
            tokens = list(self._ids)[:3]
            probe = "".join(f"{_PROBE}{t}" for t in tokens) + _PROBE
            if self._encode_split(probe) != self._whole(probe):
                log.warning("segment encoding disagrees with whole-text encoding for this tokenizer: off")
                self.enabled = False
            self._cache.clear()
            self._chars = 0

    def _whole(self, text: str) -> list[int]:
        return list(self._tok(text, add_special_tokens=False)["input_ids"])

    def encode(self, text: str) -> list[int]:
        if not self.enabled:
            return self._whole(text)
        return self._encode_split(text)

    def _encode_split(self, text: str) -> list[int]:
        assert self._split is not None and self._raw is not None
        out: list[int] = []
        ids_of = self._ids
        cache = self._cache
        for i, piece in enumerate(self._split.split(text)):
            if i % 2:
                out.append(ids_of[piece])
                continue
            if not piece:
                continue
            if len(piece) < self.MIN_CACHED_CHARS:
                out.extend(self._raw.encode(piece, add_special_tokens=False).ids)
                continue
            ids = cache.get(piece)
            if ids is not None:
                cache.move_to_end(piece)
                self.hits += 1
            else:
                self.misses += 1
                ids = self._raw.encode(piece, add_special_tokens=False).ids
                if len(piece) <= self.max_chars // 4:
                    cache[piece] = ids
                    self._chars += len(piece)
                    while self._chars > self.max_chars:
                        old, _ = cache.popitem(last=False)
                        self._chars -= len(old)
            out.extend(ids)
        return out
