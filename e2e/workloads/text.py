"""Deterministic prompt text with an exact token count under the Qwen2.5 tokenizer.

Words are taken from the vocabulary itself: tokens that are a space followed by 3–8 lowercase letters.
The pre-tokenizer splits text at those word boundaries, so `n` such words encode to exactly `n` tokens,
which lets workloads say "a 2048-token system prompt" and mean it.
"""

from __future__ import annotations

import random
from functools import lru_cache

from epp.tokenization.qwen import load_qwen25_tokenizer


@lru_cache(maxsize=1)
def _vocabulary_words() -> tuple[str, ...]:
    tok = load_qwen25_tokenizer()
    words = []
    for token, _id in tok.get_vocab().items():
        # byte-level BPE shows a leading space as "Ġ"
        word = token[1:]
        if token.startswith("Ġ") and 3 <= len(word) <= 8 and word.isascii() and word.isalpha() and word.islower():
            words.append(" " + word)
    words.sort()
    return tuple(words)


class TextFactory:
    """Makes seeded word sequences; the same (seed, key, n) always gives the same text."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self.words = _vocabulary_words()

    def tokens(self, key: object, n_tokens: int) -> list[str]:
        """`n_tokens` words, each with its leading space (one token each)."""
        rng = random.Random(f"{self.seed}:{key}")
        return rng.choices(self.words, k=n_tokens) if n_tokens > 0 else []

    def text(self, key: object, n_tokens: int) -> str:
        """Text of exactly `n_tokens` tokens; it starts with a space, so concatenations keep their counts."""
        return "".join(self.tokens(key, n_tokens))
