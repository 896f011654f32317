"""Model names come from clients: with a default tokenizer directory every name is served by it, and what the
backend keeps per model (the tokenizer, its segment cache of up to 32M characters, the vision settings) must not
grow with the number of names a client sends."""

from __future__ import annotations

from epp.tokenization.prompt import HFBackend
from epp.tokenization.qwen import qwen25_tokenizer_dir


async def test_per_model_state_is_kept_per_directory_not_per_client_model_name() -> None:
    backend = HFBackend({}, qwen25_tokenizer_dir())
    first = await backend.chat("m-0", [{"role": "user", "content": "hello there"}], {})
    for i in range(200):
        model = f"m-{i}"
        assert await backend.chat(model, [{"role": "user", "content": "hello there"}], {}) == first
        await backend.completion(model, "hello")
        await backend.vision(model)
    assert len(backend._tok) == 1
    assert len(backend._seg) == 1
    assert len(backend._vision) == 1


async def test_models_mapped_to_one_directory_share_its_state() -> None:
    d = qwen25_tokenizer_dir()
    backend = HFBackend({"a": d, "b": d})
    ids_a = await backend.completion("a", "same text")
    assert await backend.completion("b", "same text") == ids_a
    await backend.chat("a", [{"role": "user", "content": "x"}], {})
    await backend.chat("b", [{"role": "user", "content": "x"}], {})
    assert len(backend._seg) == 1
