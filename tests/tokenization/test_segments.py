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


def test_chunked_completions_equal_whole_text_encoding(hf: Any) -> None:
    """Long completions prompts are cut into chunks; the ids stay those of `tok(text, add_special_tokens=True)`."""
    enc = SegmentEncoder(hf)
    assert enc.completions and enc.chunk_chars == SegmentEncoder.CHUNK_CHARS
    rnd = random.Random(11)
    words = [w for w in WORDS if w] + ["Alpha", "beta", "x", "yz", "don't", "3", "4.5", "--", "  ", "\n"]
    for size in (30, 300, 900, 2500):
        for _ in range(12):
            text = " ".join(rnd.choice(words) for _ in range(size)) + rnd.choice(["", " ", "\n", "!"])
            assert enc.encode_completion(text) == list(hf(text, add_special_tokens=True)["input_ids"]), size


def test_prompts_sharing_a_head_encode_only_the_rest(hf: Any) -> None:
    """A shared-prefix workload: the second prompt's shared chunks come from the cache, the ids are unchanged."""
    backend = HFBackend({QWEN25_MODEL: qwen25_tokenizer_dir()}, offload_chars=10**9)
    rnd = random.Random(13)
    head = " ".join(rnd.choice(["alpha", "beta", "gamma", "delta", "epsilon", "zeta"]) for _ in range(1500))
    first = asyncio.run(backend.completion(QWEN25_MODEL, head + " first question"))
    enc = backend._seg[str(qwen25_tokenizer_dir())]
    assert len(head) > 10 * enc.chunk_chars and enc.misses > 10  # the head went in as many chunks
    misses, hits = enc.misses, enc.hits
    text = head + " second question, another one"
    assert enc.uncached_chars(text) < 2 * enc.chunk_chars
    second = asyncio.run(backend.completion(QWEN25_MODEL, text))
    assert enc.misses - misses <= 2 and enc.hits - hits > 10
    assert second == list(hf(text, add_special_tokens=True)["input_ids"])
    assert second[: len(first) - 8] == first[: len(first) - 8]


def _trained(pre: Any, corpus: list[str]) -> Any:
    from tokenizers import Tokenizer, models, trainers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE(unk_token="<unk>"))
    raw.pre_tokenizer = pre
    raw.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"]))
    return PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def test_tokenizers_whose_words_do_not_end_at_spaces_are_not_chunked() -> None:
    """SentencePiece-style Metaspace prepends "▁" to a text's first word, and a model without pre-tokenizer merges
    across spaces: a cut would change the ids, so neither is chunked (Metaspace's "first" scheme also fails the
    segment probe: a piece after an added token would gain a "▁") and the ids stay the whole-text ones."""
    from tokenizers import pre_tokenizers

    rnd = random.Random(17)
    words = ["lorem", "ipsum", "dolor", "sit", "amet", "x"]
    corpus = [" ".join(rnd.choice(words) for _ in range(60)) for _ in range(60)]
    text = " ".join(corpus) + "</s>" + corpus[0] + " " + " ".join(corpus[1:4])
    for pre in (pre_tokenizers.Metaspace(prepend_scheme="first"), pre_tokenizers.Metaspace(), None):
        tok = _trained(pre, corpus)
        enc = SegmentEncoder(tok)
        assert enc.chunk_chars == 0, pre
        assert enc.encode(text) == list(tok(text, add_special_tokens=False)["input_ids"]), pre
    # ByteLevel's own regex splits words the same way: chunked, and still exact
    tok = _trained(pre_tokenizers.ByteLevel(add_prefix_space=False), corpus)
    enc = SegmentEncoder(tok)
    assert enc.chunk_chars == SegmentEncoder.CHUNK_CHARS
    assert enc.encode(text) == list(tok(text, add_special_tokens=False)["input_ids"])


def test_the_segment_encoder_is_built_on_the_tokenizer_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its probes encode a few texts: at warm-up, or on the first request, never on the event loop."""
    import threading

    from epp.tokenization import prompt

    built: list[str] = []

    class Recording(SegmentEncoder):
        def __init__(self, tok: Any) -> None:
            built.append(threading.current_thread().name)
            super().__init__(tok)

    monkeypatch.setattr(prompt, "SegmentEncoder", Recording)
    for warm in (True, False):
        backend = HFBackend({QWEN25_MODEL: qwen25_tokenizer_dir()})

        async def run(b: HFBackend = backend, w: bool = warm) -> list[int]:
            if w:
                await b.warm()
            return await b.completion(QWEN25_MODEL, "hello world " * 10)

        ids = asyncio.run(run())
        assert ids and len(built) == 1 and built.pop().startswith("tokenize")
