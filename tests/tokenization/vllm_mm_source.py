"""vLLM's own multimodal code, run without importing vllm (torch is not installed): the image loader
(`ImageMediaIO.load_bytes` and the image helpers), `MediaWithBytes`, `MultiModalHasher`, the block-hash extra keys
(`generate_block_hash_extra_keys`, `to_event_extra_keys`) and transformers' Qwen2-VL `smart_resize`.

Each named definition is executed from the installed files (see vllm_source.load); torch is a module with an empty
`Tensor` class (the hasher only tests `isinstance(obj, torch.Tensor)`), `envs` gives the defaults it reads.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import importlib.util
import io
import logging
import math
import pickle
import sys
import types
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar, cast

import numpy as np
from PIL import Image, ImageOps

from tests.tokenization.vllm_source import load


def _ns() -> dict[str, Any]:
    torch = types.ModuleType("torch")

    class Tensor:  # nothing here is a tensor
        pass

    torch.Tensor = Tensor  # type: ignore[attr-defined]
    module = types.ModuleType("_vllm_mm_source")  # registered: dataclasses look their module up
    sys.modules[module.__name__] = module
    ns = module.__dict__
    ns.update({
        "Any": Any, "Generic": Generic, "TypeVar": TypeVar, "cast": cast, "Callable": Callable,
        "Iterable": Iterable, "Iterator": Iterator, "dataclass": dataclass, "field": field, "Path": Path,
        "ABC": ABC, "abstractmethod": abstractmethod, "np": np, "torch": torch, "Image": Image,
        "ImageOps": ImageOps, "contextlib": contextlib, "functools": functools, "hashlib": hashlib,
        "pickle": pickle, "uuid": uuid, "BytesIO": io.BytesIO, "math": math, "pybase64": base64,
        "envs": types.SimpleNamespace(VLLM_MAX_IMAGE_PIXELS=0), "logger": logging.getLogger("vllm-mm-source"),
        "_T": TypeVar("_T"),
    })  # fmt: skip
    return ns


@functools.cache
def vllm() -> types.SimpleNamespace:
    ns = _ns()
    load("multimodal/image.py", {"ALLOWED_IMAGE_FORMATS", "open_image", "normalize_image", "rgba_to_rgb",
                                 "_has_transparency", "convert_image_mode"}, ns)  # fmt: skip
    load("multimodal/media/base.py", {"MediaWithBytes", "MediaIO"}, ns)
    load("multimodal/media/image.py", {"ImageMediaIO"}, ns)
    load("multimodal/hasher.py", {"_LENGTH_BYTES", "_TAG_NONE", "_TAG_SEQUENCE", "_TAG_MAPPING", "_TAG_LEAF",
                                  "_encode_length", "_framed", "_get_hasher_factory", "_get_image_id_bytes",
                                  "MultiModalHasher"}, ns)  # fmt: skip
    load("v1/core/kv_cache_utils.py", {"_gen_mm_extra_hash_keys", "_gen_lora_extra_hash_keys",
                                       "_gen_prompt_embeds_extra_hash_keys", "generate_block_hash_extra_keys",
                                       "to_event_extra_keys"}, ns)  # fmt: skip
    spec = importlib.util.find_spec("transformers")
    assert spec is not None and spec.origin is not None
    tf = Path(spec.origin).parent / "models" / "qwen2_vl" / "image_processing_qwen2_vl.py"
    tree_ns: dict[str, Any] = {"math": math}
    exec(compile(_function_source(tf, "smart_resize"), str(tf), "exec"), tree_ns)
    ns["smart_resize"] = tree_ns["smart_resize"]
    return types.SimpleNamespace(**ns)


def _function_source(path: Path, name: str) -> str:
    import ast

    tree = ast.parse(path.read_text())
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    return ast.unparse(node)


def mm_hash(data: bytes, model_id: str, algorithm: str = "blake3") -> str:
    """What vLLM's processor hashes for an image part whose URL held `data`."""
    v = vllm()
    item = v.ImageMediaIO().load_bytes(data)
    return str(v.MultiModalHasher.hash_kwargs(algorithm, model_id=model_id, image=item))


def qwen2vl_image_tokens(width: int, height: int, min_pixels: int = 3136, max_pixels: int = 12845056) -> int:
    """vLLM's Qwen2VLProcessingInfo._get_vision_info for one image (patch 14, merge 2, temporal patch 2)."""
    h, w = vllm().smart_resize(height=height, width=width, factor=28, min_pixels=min_pixels, max_pixels=max_pixels)
    grid_t = max((1 + (-1 % 2)) // 2, 1)
    return grid_t * (h // 14) * (w // 14) // 4


def block_extra_keys(
    n_blocks: int, block_size: int, items: list[tuple[str, int, int]], cache_salt: str | None = None
) -> list[tuple[Any, ...] | None]:
    """vLLM's per-block extra keys for a request with these mm items (identifier, offset, length)."""
    v = vllm()
    feats = [
        types.SimpleNamespace(identifier=i, mm_position=types.SimpleNamespace(offset=o, length=n)) for i, o, n in items
    ]
    req = types.SimpleNamespace(mm_features=feats, lora_request=None, cache_salt=cache_salt, prompt_embeds=None)
    out: list[tuple[Any, ...] | None] = []
    mm_idx = 0
    for b in range(n_blocks):
        keys, mm_idx = v.generate_block_hash_extra_keys(req, b * block_size, (b + 1) * block_size, mm_idx)
        out.append(keys)
    return out


def event_extra_keys(keys: list[tuple[Any, ...] | None]) -> list[tuple[Any, ...] | None] | None:
    return cast(list[tuple[Any, ...] | None] | None, vllm().to_event_extra_keys(keys))
