"""Seed inputs for each target, taken from what the tests send: request bodies of every API shape, the anchors'
config corpus (tests/corpus/anchors) and our shipped configs, and KV-event batches in vLLM's (map) and the
positional (older vLLM, SGLang) encodings."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import msgpack

from fuzz.targets import PATHS

ROOT = Path(__file__).resolve().parent.parent


def _path(p: str) -> bytes:
    return bytes([PATHS.index(p)])


MEDIA = [{"type": "text", "text": "x"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]


def request_seeds() -> Iterator[bytes]:
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    bodies: list[tuple[str, object]] = [
        ("/v1/completions", {"model": "m", "prompt": "hello", "max_tokens": 3}),
        ("/v1/completions", {"model": "alias", "prompt": [1, 2, 3], "cache_salt": "s"}),
        ("/v1/completions", {"model": "m", "prompt": [[1, 2], [3]]}),
        ("/v1/chat/completions", chat),
        ("/v1/chat/completions", {**chat, "tools": [{"type": "function", "function": {"name": "f"}}]}),
        ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": MEDIA}]}),
        ("/v1/responses", {"model": "m", "input": [{"role": "user", "content": "x"}], "max_output_tokens": 5}),
        ("/v1/embeddings", {"model": "m", "input": ["a", "b"]}),
        ("/v1/messages", {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}]}),
        ("/v1/conversations", {"model": "m", "items": [{"type": "message"}]}),
        ("/v1/images/generations", {"model": "m", "prompt": "a cat"}),
        ("/generate", {"text": "hello", "sampling_params": {"max_new_tokens": 4}}),
        ("/inference/v1/generate", {"model": "m", "token_ids": [1, 2, 3]}),
    ]
    for path, body in bodies:
        yield _path(path) + json.dumps(body).encode()
    yield _path("/v1/completions") + b'{"model":"m","prompt":"x\\ud800y","n":1e999}'


def config_seeds() -> Iterator[bytes]:
    for d in (ROOT / "tests" / "corpus" / "anchors", ROOT / "config"):
        for f in sorted(d.glob("*.yaml")):
            yield f.read_bytes()


def kv_seeds() -> Iterator[bytes]:
    tokens = list(range(64))
    stored_pos = ["BlockStored", [11, 12, 13, 14], None, tokens, 16, None, "GPU", None]
    stored_map = {"type": "BlockStored", "block_hashes": [b"\x01" * 32, b"\x02" * 32], "parent_block_hash": None,
                  "token_ids": tokens[:32], "block_size": 16, "medium": "CPU", "lora_name": "a",
                  "extra_keys": [["salt"], None], "group_idx": 0, "kv_cache_spec_kind": "full_attention"}  # fmt: skip
    batches: list[object] = [
        [1.7e9, [stored_pos], 0],
        [1.7e9, [stored_map, {"type": "BlockRemoved", "block_hashes": [b"\x01" * 32], "medium": "CPU"}], None],
        [1.7e9, [stored_pos, ["BlockStored", [15], 14, list(range(16)), 16], ["BlockRemoved", [12]]]],
        [1.7e9, [["AllBlocksCleared"]], 1],
        {"ts": 1.7e9, "events": [stored_pos], "data_parallel_rank": 0},
        [1.7e9, [["Unknown", 1]]],
    ]
    for b in batches:
        for model in range(2):
            yield bytes([model]) + msgpack.packb(b)


SEEDS = {"request": request_seeds, "config": config_seeds, "kv_events": kv_seeds}
