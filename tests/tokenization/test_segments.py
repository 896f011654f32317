"""Segment encoding: the ids equal whole-text encoding on chat prompts, and later turns reuse earlier segments."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest

from epp.tokenization.prompt import HFBackend
from epp.tokenization.qwen import QWEN25_MODEL, load_qwen25_tokenizer, qwen25_tokenizer_dir
from epp.tokenization.segments import SegmentEncoder

TEMPLATES = {p.stem: p.read_text() for p in (Path(__file__).parent / "templates").glob("*.jinja")}
WORDS = [
    "the",
    "a",
    "of",
    "tool",
    "résumé",
    "naïve",
    "東京",
    "'ll",
    "'re",
    "",
    "\t\n\n",
    "",
    "```py\nx",
    "=",
    "1\n```",
    '{"k":',
    "[1,",
    "2]}",
    "<s>",
    "</s>",
    "<|im_start|>",
]


@pytest.fixture(scope="module")
def hf() -> Any:
    return load_qwen25_tokenizer()


def _text(rnd: random.Random, n: int) -> str:
    return " ".join(rnd.choice(WORDS) for _ in range(n)) + rnd.choice(["", " ", "\n", "  \n"])


@pytest.mark.parametrize("template", sorted(TEMPLATES))
def test_segment_encoding_equals_whole_text_encoding(hf: Any, template: str) -> None:
    enc = SegmentEncoder(hf)
    assert enc.enabled
    rnd = random.Random(7)
    for _ in range(40):
        convo = [{"role": "system", "content": _text(rnd, 80)}]
        for turn in range(rnd.randrange(1, 5)):
            convo.append({"role": "user", "content": _text(rnd, rnd.randrange(0, 120))})
            convo.append({"role": "assistant", "content": _text(rnd, rnd.randrange(0, 60))})
            del turn
        convo.append({"role": "user", "content": _text(rnd, 30)})
        text = hf.apply_chat_template(
            convo, chat_template=TEMPLATES[template], tokenize=False, add_generation_prompt=True
        )
        assert enc.encode(text) == list(hf(text, add_special_tokens=False)["input_ids"])


def test_a_later_turn_reuses_the_earlier_segments(hf: Any) -> None:
    backend = HFBackend({QWEN25_MODEL: qwen25_tokenizer_dir()})
    rnd = random.Random(3)
    convo = [{"role": "system", "content": _text(rnd, 400)}, {"role": "user", "content": _text(rnd, 200)}]
    first = asyncio.run(backend.chat(QWEN25_MODEL, convo, {}))
    enc = backend._seg[str(qwen25_tokenizer_dir())]
    misses = enc.misses
    convo += [{"role": "assistant", "content": _text(rnd, 100)}, {"role": "user", "content": _text(rnd, 50)}]
    second = asyncio.run(backend.chat(QWEN25_MODEL, convo, {}))
    assert second[: len(first) - 3] == first[: len(first) - 3]  # the generation prompt's tail differs
    assert enc.hits >= 2  # the system prompt and the first user message came from the cache
    assert enc.misses - misses <= 2  # only the new assistant and user messages were encoded
    text = hf.apply_chat_template(convo, tokenize=False, add_generation_prompt=True)
    assert second == list(hf(text, add_special_tokens=False)["input_ids"])


def test_the_cache_is_bounded_by_characters(hf: Any) -> None:
    enc = SegmentEncoder(hf, max_chars=4000)
    rnd = random.Random(5)
    for _ in range(50):
        enc.encode("<|im_start|>user\n" + _text(rnd, 200) + "<|im_end|>")
    assert enc._chars <= 4000 and len(enc._cache) < 50


def test_a_tokenizer_whose_added_tokens_strip_whitespace_is_encoded_whole(hf: Any) -> None:
    class Stripping:
        def __init__(self, t: Any) -> None:
            self.content, self.lstrip, self.rstrip, self.single_word = t.content, True, False, False

    class Tok:
        backend_tokenizer = hf.backend_tokenizer
        added_tokens_decoder = {i: Stripping(t) for i, t in hf.added_tokens_decoder.items()}

        def convert_tokens_to_ids(self, t: str) -> int:
            return int(hf.convert_tokens_to_ids(t))

        def __call__(self, text: str, add_special_tokens: bool) -> Any:
            return hf(text, add_special_tokens=add_special_tokens)

    enc = SegmentEncoder(Tok())
    assert not enc.enabled
    text = "<|im_start|>user\n hi <|im_end|>"
    assert enc.encode(text) == list(hf(text, add_special_tokens=False)["input_ids"])
