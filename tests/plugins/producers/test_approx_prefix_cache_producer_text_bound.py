"""The approximate prefix producers hash at most maxPrefixBlocksToMatch blocks, so they build only that much of the
prompt's text (a 120 MiB prompt was copied whole, twice over, to hash its first 16 KiB): same hashes either way."""

from __future__ import annotations

import random

import pytest

from epp.framework import ApiKind
from epp.framework.types import InferenceRequest
from epp.plugins.contracts.prompt import request_text
from epp.plugins.producers.approx_prefix_cache_producer import block_hashes


def _chat(rng: random.Random) -> InferenceRequest:
    messages = []
    for _ in range(rng.randint(1, 6)):
        content: object = "".join(rng.choice("ab c") for _ in range(rng.randint(0, 300)))
        if rng.random() < 0.2:
            content = [{"type": "text", "text": content}]
        messages.append({"role": rng.choice(["system", "user", "assistant"]), "content": content})
    return InferenceRequest(request_id="r", path="/v1/chat/completions", api=ApiKind.CHAT, model="m", target_model="m",
                            body={"messages": messages}, headers={}, messages=messages)  # fmt: skip


@pytest.mark.parametrize("seed", range(40))
def test_bounded_text_hashes_like_the_whole_text(seed: int) -> None:
    rng = random.Random(seed)
    req = _chat(rng)
    block_chars, max_blocks = rng.choice([4, 8, 64]), rng.choice([1, 3, 16])
    limit = block_chars * max_blocks
    bounded = request_text(req, limit)
    whole = request_text(req)
    assert bounded == whole[:limit]
    assert block_hashes(bounded, block_chars, max_blocks, 7) == block_hashes(whole, block_chars, max_blocks, 7)


def test_huge_prompt_is_not_copied_whole() -> None:
    prompt = "x" * 1_000_000
    chat = InferenceRequest(request_id="r", path="/v1/chat/completions", api=ApiKind.CHAT, model="m", target_model="m",
                            body={}, headers={}, messages=[{"role": "user", "content": prompt}] * 3)  # fmt: skip
    assert len(request_text(chat, 1000)) < 1010
    completion = InferenceRequest(request_id="r", path="/v1/completions", api=ApiKind.COMPLETIONS, model="m",
                                  target_model="m", body={}, headers={}, prompt=prompt)  # fmt: skip
    assert request_text(completion, 1000) == "x" * 1000
    assert block_hashes(request_text(completion, 64 * 4), 64, 4, 1) == block_hashes(prompt, 64, 4, 1)
