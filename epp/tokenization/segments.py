"""Incremental encoding of prompts: one added-token-delimited segment at a time, long segments in chunks, with
a cache.

A Hugging Face tokenizer extracts its added tokens (`<|im_start|>`, `<|im_end|>`, ...) from the text before it
normalizes and pre-tokenizes, and encodes every piece between them on its own. So the ids of a text are the
concatenation of the ids of its pieces split at added tokens, and a chat template puts added tokens between
messages: a multi-turn conversation only needs its new messages encoded, the earlier ones come from the cache.
Tokenizers whose added tokens strip neighbouring whitespace or match single words only break that equivalence;
for them (and when a probe disagrees with the whole-text encoding) the encoder is off and encodes whole texts.

A long piece (a completions prompt, a long system message) is cut further, at a space between two ASCII letters
about every CHUNK_CHARS characters: a byte-level pre-tokenizer (GPT-2, Llama 3, Qwen) ends a word at that space
and starts the next word with it, so no token crosses the cut. The cuts depend only on the text before them, so
prompts that share a prefix (a shared system prompt or document, few-shot examples) share their chunks and only
the chunks from where they differ are encoded. Tokenizers that treat the start of a text specially (SentencePiece's
prepended "▁") fail the probe, and their pieces are not chunked.
"""

from __future__ import annotations

import json
import logging
import re
from array import array
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any

log = logging.getLogger(__name__)

_PROBE = "w<s> a\n  b\t\nc 'll  x"  # starts with a letter: after an added token, a piece with no space first
# Chunking's probe: words, contractions, digits, punctuation, whitespace runs, accents and CJK around the cuts.
_CHUNK_PROBE = (
    "The quick brown fox's den, 42 foxes   jumped over\tthe lazy dog's 3.14 kennels; naïve café owners "
    "said \"hello world\" in 東京 and Zürich --- then we'll see: a b c d e f g hh ii jj kk don't STOP now "
    "x1 y2 z3 ABC def GHI\n\nnew paragraph  with  double  spaces and-hyphenated words (parenthesised) end. "
) * 3
_SAFE_CUT = re.compile(r"(?<=[A-Za-z]) (?=[A-Za-z])")
_PER_CHAR_NORMALIZERS = {"NFC", "NFD", "NFKC", "NFKD", "Lowercase", "StripAccents"}


def _state(component: Any) -> dict[str, Any]:
    if component is None:
        return {}
    state = json.loads(component.__getstate__())
    return state if isinstance(state, dict) else {}


def _cuts_at_words(raw: Any) -> bool:
    """Whether a cut at a space between two letters keeps the ids: the pre-tokenizer splits words regex-style (a
    `Split` on letter runs, or ByteLevel's own regex) without adding a prefix space, and the normalizer works
    character by character. SentencePiece's Metaspace, a model without pre-tokenizer (merges may cross spaces)
    and prefix-adding normalizers are not cut; the probe then checks the rest."""
    try:
        pre = _state(raw.pre_tokenizer)
        norm = _state(raw.normalizer)
    except (AttributeError, TypeError, ValueError):
        return False
    parts = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    words = False
    for part in parts:
        kind = part.get("type")
        if kind == "Split":
            words = words or "\\p{L}+" in json.dumps(part.get("pattern"))
        elif kind == "ByteLevel":
            if part.get("add_prefix_space"):
                return False
            words = words or bool(part.get("use_regex"))
        else:
            return False
    norms = norm.get("normalizers", [norm]) if norm.get("type") == "Sequence" else [norm] if norm else []
    return words and all(n.get("type") in _PER_CHAR_NORMALIZERS for n in norms)


class SegmentEncoder:
    """`encode(text)` == `tok(text, add_special_tokens=False)["input_ids"]`, reusing cached segments."""

    MIN_CACHED_CHARS = 64  # shorter pieces are cheaper to encode than to look up and hold
    CHUNK_CHARS = 512  # a long piece is cut about this often (the unshared tail costs about half of it)

    def __init__(self, tok: Any, max_chars: int = 32 << 20) -> None:
        self._tok = tok
        self._raw = getattr(tok, "backend_tokenizer", None)
        self.max_chars = max_chars
        self._cache: OrderedDict[str, array[int]] = OrderedDict()  # 4 bytes a token, not a list of int objects
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
        self.chunk_chars = 0  # off until the probe agrees
        self.completions = False  # completions prompts (add_special_tokens=True) encoded here too
        self._prefix: list[int] = []  # what add_special_tokens=True puts before a text (a BOS), if anything
        if self.enabled:
            tokens = list(self._ids)[:3]
            probe = "".join(f"{_PROBE}{t}" for t in tokens) + _PROBE
            if self._encode_split(probe) != self._whole(probe):
                log.warning("segment encoding disagrees with whole-text encoding for this tokenizer: off")
                self.enabled = False
        if self.enabled and _cuts_at_words(self._raw):
            self.chunk_chars = 16  # many cuts in the probe
            probe = _CHUNK_PROBE + next(iter(self._ids)) + _CHUNK_PROBE
            if self._encode_split(probe) == self._whole(probe):
                self.chunk_chars = self.CHUNK_CHARS
            else:
                log.info("chunked encoding disagrees with whole-text encoding for this tokenizer: pieces encoded whole")
                self.chunk_chars = 0
            self._prefix = list(tok("", add_special_tokens=True)["input_ids"])
            with_specials = list(tok(probe, add_special_tokens=True)["input_ids"])
            self.completions = with_specials == self._prefix + self._encode_split(probe)
        self._cache.clear()
        self._chars = 0

    def _whole(self, text: str) -> list[int]:
        return list(self._tok(text, add_special_tokens=False)["input_ids"])

    def encode(self, text: str) -> list[int]:
        if not self.enabled:
            return self._whole(text)
        return self._encode_split(text)

    def encode_completion(self, text: str) -> list[int]:
        """`tok(text, add_special_tokens=True)["input_ids"]` (what vLLM's completions API encodes); only when
        `completions` (the probe agreed)."""
        return self._prefix + self._encode_split(text)

    def uncached_chars(self, text: str) -> int:
        """How many characters of `text` an encode would have to tokenize (to decide whether it is worth a thread
        hop)."""
        if not self.enabled:
            return len(text)
        cache = self._cache
        short = self.MIN_CACHED_CHARS
        return sum(len(p) for added, p in self._parts(text) if not added and (len(p) < short or p not in cache))

    def _parts(self, text: str) -> Iterator[tuple[bool, str]]:
        """The text in encoding order: (True, an added token) or (False, a chunk of the text between them)."""
        assert self._split is not None
        for i, piece in enumerate(self._split.split(text)):
            if i % 2:
                yield True, piece
            elif piece:
                for chunk in self._chunks(piece):
                    yield False, chunk

    def _chunks(self, piece: str) -> list[str]:
        """The piece cut at safe spaces about every chunk_chars characters (whole when short or chunking is off)."""
        size = self.chunk_chars
        if not size or len(piece) < 2 * size:
            return [piece]
        out = []
        start = 0
        search = _SAFE_CUT.search
        while True:
            m = search(piece, start + size)
            if m is None or len(piece) - m.start() < size // 2:
                out.append(piece[start:])
                return out
            out.append(piece[start : m.start()])
            start = m.start()

    def _encode_split(self, text: str) -> list[int]:
        out: list[int] = []
        ids_of = self._ids
        for added, part in self._parts(text):
            if added:
                out.append(ids_of[part])
            else:
                out.extend(self._encode_piece(part))
        return out

    def _encode_piece(self, piece: str) -> Sequence[int]:
        raw = self._raw
        assert raw is not None
        if len(piece) < self.MIN_CACHED_CHARS:
            ids: Sequence[int] = raw.encode(piece, add_special_tokens=False).ids
            return ids
        cache = self._cache
        held = cache.get(piece)
        if held is not None:
            cache.move_to_end(piece)
            self.hits += 1
            return held
        self.misses += 1
        ids = array("i", raw.encode(piece, add_special_tokens=False).ids)
        if len(piece) <= self.max_chars // 4:
            cache[piece] = ids
            self._chars += len(piece)
            while self._chars > self.max_chars:
                old, _ = cache.popitem(last=False)
                self._chars -= len(old)
        return ids
