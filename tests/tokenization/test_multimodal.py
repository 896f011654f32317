"""Multimodal parity with vLLM's own code (tests/tokenization/vllm_mm_source.py runs it without torch): the mm hash
of an image part, the Qwen2-VL placeholder count, the per-block extra keys, and a whole chat prompt with images
tokenized by the local tokenizer."""

from __future__ import annotations

import base64
import io
from typing import Any

import pytest
from PIL import Image

from epp.framework import TokenizationError
from epp.kvcache.tokens import TokenProcessor, request_extra_keys
from epp.tokenization.multimodal import VisionConfig, decode_data_url, hash_image, inspect_image
from epp.tokenization.prompt import HFBackend, PromptTokenizer, expand_placeholders
from epp.tokenization.qwen import QWEN25_VL_MODEL, qwen25_tokenizer_dir, qwen25_vl_tokenizer_dir
from tests.tokenization import vllm_mm_source as vllm

PAD = 151655  # <|image_pad|>


def encoded(mode: str, size: tuple[int, int], fmt: str = "PNG", **save: Any) -> bytes:
    color: Any = {"RGB": (200, 30, 60), "RGBA": (1, 2, 3, 128), "L": 90, "LA": (90, 10), "P": 3}[mode]
    img = Image.new(mode, size, color)
    if mode == "P":
        img.putpalette([i % 256 for i in range(768)])
    buf = io.BytesIO()
    img.save(buf, fmt, **save)
    return buf.getvalue()


def noise_jpeg(width: int, height: int) -> bytes:
    import numpy as np

    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (height, width, 3), dtype=np.uint8)).save(buf, "JPEG")
    return buf.getvalue()


def with_exif(size: tuple[int, int], orientation: int | None = None, image_id: str | None = None) -> bytes:
    img = Image.new("RGB", size, (5, 6, 7))
    exif = Image.Exif()
    if orientation is not None:
        exif[0x0112] = orientation
    if image_id is not None:
        exif[0xA420] = image_id
    buf = io.BytesIO()
    img.save(buf, "JPEG", exif=exif)
    return buf.getvalue()


IMAGES = {
    "rgb-png": encoded("RGB", (64, 48)),
    "rgb-jpeg": encoded("RGB", (33, 17), "JPEG"),
    "rgba-png": encoded("RGBA", (20, 20)),
    "gray-jpeg": encoded("L", (50, 70), "JPEG"),
    "la-png": encoded("LA", (8, 9)),
    "palette-transparent-png": encoded("P", (16, 16), transparency=3),
    "palette-gif": encoded("P", (16, 16), "GIF"),
    "rgb-png-trns": encoded("RGB", (12, 12), transparency=(200, 30, 60)),
    "exif-rotated": with_exif((40, 20), orientation=6),
    "large-noise-jpeg": noise_jpeg(1200, 900),  # > 256 KiB: decoded and hashed in pieces
}


@pytest.mark.parametrize("name", sorted(IMAGES))
@pytest.mark.parametrize("algorithm", ["blake3", "sha256"])
def test_image_hash_equals_vllms(name: str, algorithm: str) -> None:
    data = IMAGES[name]
    ours = hash_image("Qwen/Qwen2.5-VL-3B-Instruct", inspect_image(data).media, algorithm)
    assert ours == vllm.mm_hash(data, "Qwen/Qwen2.5-VL-3B-Instruct", algorithm)


def test_hash_depends_on_model_and_content() -> None:
    a, b = IMAGES["rgb-png"], IMAGES["rgb-jpeg"]
    assert hash_image("m1", inspect_image(a).media) != hash_image("m2", inspect_image(a).media)
    assert hash_image("m1", inspect_image(a).media) != hash_image("m1", inspect_image(b).media)


def test_exif_orientation_swaps_the_size_and_a_text_image_id_changes_nothing() -> None:
    info = inspect_image(IMAGES["exif-rotated"])
    assert (info.width, info.height) == (20, 40)
    # files carry ImageID as text; only an in-memory UUID (never from a URL) replaces the content in vLLM's hash
    data = with_exif((30, 30), image_id="12345678-1234-5678-1234-567812345678")
    assert hash_image("m", inspect_image(data).media) == vllm.mm_hash(data, "m")


@pytest.mark.parametrize(
    "size",
    [(640, 360), (1, 1), (28, 28), (27, 29), (1920, 1080), (4000, 3000), (100, 5000), (5000, 5000), (56, 3000)],
)
def test_qwen2vl_placeholder_count_equals_vllms(size: tuple[int, int]) -> None:
    w, h = size
    assert VisionConfig().image_tokens(w, h) == vllm.qwen2vl_image_tokens(w, h)
    small = VisionConfig(min_pixels=3136, max_pixels=200_000)
    assert small.image_tokens(w, h) == vllm.qwen2vl_image_tokens(w, h, max_pixels=200_000)


@pytest.mark.parametrize(
    ("items", "salt"),
    [
        ([("h1", 10, 20)], None),
        ([("h1", 10, 20)], "s"),
        ([("h1", 0, 16)], None),
        ([("h1", 3, 4), ("h2", 9, 30), ("h1", 50, 2)], "salt"),
        ([("h1", 16, 64)], None),
    ],
)
def test_block_extra_keys_carry_vllms_identifiers(items: list[tuple[str, int, int]], salt: str | None) -> None:
    """Our per-block extra keys hold, block by block, the identifiers (and salt) vLLM puts in its block hashes."""
    n = 6
    theirs = vllm.block_extra_keys(n, 16, items, salt)
    ours = request_extra_keys(n, 16, salt, items) or [None] * n
    expected = [
        None if keys is None else [k[1] for k in keys if k[0] in ("mm", "cache_salt")] or None for keys in theirs
    ]
    assert ours == expected
    # and what ingest reads from vLLM's events folds to the same strings (offsets dropped)
    from epp.kvcache.ingest import _extra_strings

    events = vllm.event_extra_keys(theirs) or [None] * n
    assert [_extra_strings(list(e) if e else None, None) for e in events] == expected


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def chat(*urls: str, text: str = "What is in the picture?") -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]


def vl_tokenizer() -> PromptTokenizer:
    return PromptTokenizer(HFBackend({}, qwen25_vl_tokenizer_dir()))


async def test_chat_with_images_expands_placeholders_and_hashes_each_item() -> None:
    a, b = encoded("RGB", (640, 360)), encoded("RGBA", (100, 300))
    tok = vl_tokenizer()
    got = await tok.tokenize_prompt(QWEN25_VL_MODEL, messages=chat(data_url(a), data_url(b)))
    feats = got.mm_features or []
    assert [f.length for f in feats] == [vllm.qwen2vl_image_tokens(640, 360), vllm.qwen2vl_image_tokens(100, 300)]
    assert [f.hash for f in feats] == [vllm.mm_hash(a, QWEN25_VL_MODEL), vllm.mm_hash(b, QWEN25_VL_MODEL)]
    for f in feats:
        assert got.token_ids[f.offset - 1] == 151652  # <|vision_start|>
        assert got.token_ids[f.offset : f.offset + f.length] == [PAD] * f.length
        assert got.token_ids[f.offset + f.length] == 151653  # <|vision_end|>
    text_only = await tok.tokenize(QWEN25_VL_MODEL, messages=[{"role": "user", "content": "What is in the picture?"}])
    assert len(got.token_ids) == len(text_only) + sum(f.length + 2 for f in feats)
    # the hash is vLLM's --model, not the served name, when the token-producer names it
    other = await tok.tokenize_prompt("served-name", messages=chat(data_url(a)), mm_model_id=QWEN25_VL_MODEL)
    assert (other.mm_features or [])[0].hash == feats[0].hash


async def test_block_keys_differ_from_the_image_on_and_match_before_it() -> None:
    tok = vl_tokenizer()
    a, b = encoded("RGB", (640, 360)), encoded("RGB", (640, 360), "JPEG")  # same size: same token ids
    pa = await tok.tokenize_prompt(QWEN25_VL_MODEL, messages=chat(data_url(a)))
    pb = await tok.tokenize_prompt(QWEN25_VL_MODEL, messages=chat(data_url(b)))
    assert pa.token_ids == pb.token_ids
    tp = TokenProcessor(16)
    fa, fb = (pa.mm_features or [])[0], (pb.mm_features or [])[0]
    n = len(pa.token_ids) // 16
    ka = tp.block_keys(pa.token_ids, "m", extra=request_extra_keys(n, 16, None, [(fa.hash, fa.offset, fa.length)]))
    kb = tp.block_keys(pb.token_ids, "m", extra=request_extra_keys(n, 16, None, [(fb.hash, fb.offset, fb.length)]))
    first = fa.offset // 16
    assert ka[:first] == kb[:first]
    assert all(x != y for x, y in zip(ka[first:], kb[first:], strict=True))


async def test_media_errors_are_tokenization_errors() -> None:
    tok = vl_tokenizer()
    with pytest.raises(TokenizationError, match="base64"):
        await tok.tokenize_prompt(QWEN25_VL_MODEL, messages=chat("data:image/png;base64,@@@"))
    with pytest.raises(TokenizationError, match="Failed to load image"):
        await tok.tokenize_prompt(QWEN25_VL_MODEL, messages=chat(data_url(b"not an image")))
    with pytest.raises(TokenizationError, match="renderer"):  # audio is hashed from decoded samples: renderer only
        await tok.tokenize_prompt(
            QWEN25_VL_MODEL,
            messages=[
                {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}
            ],
        )
    with pytest.raises(TokenizationError, match="fetching"):  # nothing listens there: refused at once
        await tok.tokenize_prompt(QWEN25_VL_MODEL, messages=chat("http://127.0.0.1:9/x.png"))
    await tok.close()  # the media session that fetch opened
    text = PromptTokenizer(HFBackend({}, qwen25_tokenizer_dir()))  # the bundled text model's template renders no image
    with pytest.raises(TokenizationError):
        await text.tokenize_prompt("m", messages=chat(data_url(IMAGES["rgb-png"])))


def test_expand_placeholders_and_data_urls() -> None:
    assert expand_placeholders([1, PAD, 2, PAD], PAD, [3, 1]) == ([1, PAD, PAD, PAD, 2, PAD], [(1, 3), (5, 1)])
    with pytest.raises(TokenizationError):
        expand_placeholders([1, PAD], PAD, [2, 2])
    assert decode_data_url("data:image/png;base64,aGk=") == b"hi"
    big = IMAGES["large-noise-jpeg"]
    assert len(big) > 1 << 18 and decode_data_url(data_url(big)) == big
    for bad in ("data:image/png;base64", "data:image/png,aGk=", "data:;base64,a GK="):
        with pytest.raises(TokenizationError):
            decode_data_url(bad)


def test_render_backend_features_are_read_sorted_and_checked() -> None:
    from epp.tokenization.prompt import render_features

    feats = render_features(
        {
            "mm_hashes": {"image": ["i1", "i0"], "audio": ["a0"]},
            "mm_placeholders": {
                "image": [{"offset": 40, "length": 8}, {"offset": 2, "length": 4}],
                "audio": [{"offset": 20, "length": 5}],
            },
        },
        64,
    )
    assert [(f.modality, f.hash, f.offset, f.length) for f in feats or []] == [
        ("image", "i0", 2, 4),
        ("audio", "a0", 20, 5),
        ("image", "i1", 40, 8),
    ]
    assert render_features({"mm_hashes": {"image": ["x"]}, "mm_placeholders": {"image": []}}, 64) is None
    assert (
        render_features(
            {"mm_hashes": {"image": ["x"]}, "mm_placeholders": {"image": [{"offset": 60, "length": 8}]}}, 64
        )
        is None
    )
    assert render_features(None, 10) is None


# -- the simulator's own implementation (e2e/sim/multimodal.py, e2e/sim/kvcache.py) against vLLM's ---------------


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_simulator_image_hash_and_placeholders_equal_vllms(name: str) -> None:
    from e2e.sim import multimodal as sim

    data = IMAGES[name]
    w, h, converted = sim.inspect(data)
    assert sim.image_hash(QWEN25_VL_MODEL, data, converted) == vllm.mm_hash(data, QWEN25_VL_MODEL)
    assert sim.image_tokens(w, h) == vllm.qwen2vl_image_tokens(w, h)


def test_simulator_block_and_event_extra_keys_equal_vllms() -> None:
    from e2e.sim.kvcache import KVCache, mm_block_keys

    items = [("h1", 3, 4), ("h2", 9, 30), ("h1", 50, 2)]
    theirs = vllm.block_extra_keys(5, 16, items, "salt")
    ours = [KVCache._extra_keys(i, None, "salt", mm_block_keys(items, i * 16, (i + 1) * 16)) for i in range(5)]
    assert ours == theirs
    events = [KVCache._event_extra_keys(i, None, "salt", mm_block_keys(items, i * 16, (i + 1) * 16)) for i in range(5)]
    assert events == vllm.event_extra_keys(theirs)


async def test_simulator_renders_the_prompt_the_epp_computes() -> None:
    from e2e.sim.multimodal import VisionRenderer

    a, b = encoded("RGB", (300, 200)), encoded("L", (90, 1200), "JPEG")
    messages = [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [{"type": "text", "text": "Compare"}, {"type": "image_url", "image_url": {"url": data_url(a)}}],
        },
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(b, "image/jpeg")}}]},
    ]
    renderer = VisionRenderer(QWEN25_VL_MODEL)
    try:
        ids, mm = await renderer.render({"messages": messages})
    finally:
        await renderer.close()
    got = await vl_tokenizer().tokenize_prompt(QWEN25_VL_MODEL, messages=messages)
    assert got.token_ids == ids
    assert [(f.hash, f.offset, f.length) for f in got.mm_features or []] == mm


async def test_a_text_only_template_refuses_media_before_loading_any() -> None:
    """The bundled Qwen2.5 (text) template renders no image parts: refused at once, nothing fetched or decoded."""
    text = PromptTokenizer(HFBackend({}, qwen25_tokenizer_dir()))
    with pytest.raises(TokenizationError, match="renders no image parts"):
        await text.tokenize_prompt("m", messages=chat("http://10.255.255.1/never-fetched.png"))
    assert not text._images
