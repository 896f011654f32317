"""Multimodal items as vLLM sees them: their mm hash and the placeholder tokens they fill.

- **Hash** (`vllm/multimodal/hasher.py` `MultiModalHasher.hash_kwargs`, called by the processor with
  `model_id=<the served model's path>, image=<item>`): a digest (blake3 by default, vLLM's `--mm-hasher-algorithm`)
  over length-framed, type-tagged chunks. An image loaded from a URL is a `MediaWithBytes`, hashed as its original
  encoded bytes (`"image"` → bytes), or, when loading converted it (any mode but RGB without transparency is
  converted to RGB), as `{"io_config": {"image_mode": "RGB", "rgba_background_color": (255, 255, 255)}, "data":
  bytes}`; an image whose EXIF carries an ImageID UUID is hashed as that UUID. A part's `uuid` is the identifier
  itself (no processor kwargs: the EPP refuses requests that set `mm_processor_kwargs`/`media_io_kwargs`).
  The block keys use the identifier, which equals the mm hash unless vLLM runs tower-connector LoRA.
- **Placeholders** (Qwen2-VL family, vLLM's `Qwen2VLProcessingInfo._get_vision_info`): the template writes
  `<|vision_start|><|image_pad|><|vision_end|>` per image; the processor repeats `<|image_pad|>` once per merged
  patch: the image is resized by `smart_resize` (factor patch·merge, pixels within [min, max]) and gives
  (h/patch)·(w/patch)/merge² tokens. The image processor's settings come from the tokenizer directory's
  `preprocessor_config.json` (Qwen2.5-VL's published defaults otherwise). Other model families' placeholder layouts
  need the model server's renderer (`tokenizer: {type: vllm}`), which returns the engine's own features.
- **Media**: `data:` URLs (base64, as vLLM) and `http(s)://` URLs, fetched with a time and size bound.
  Audio and video items (decoded frames and resampled waveforms are what vLLM hashes) are only supported through the
  render backend.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import json
import math
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from epp.framework.errors import TokenizationError

# vLLM's framing (hasher.py): every chunk is preceded by its 8-byte little-endian length, every value by a tag.
_TAG_NONE = b"\x00"
_TAG_SEQUENCE = b"\x01"
_TAG_MAPPING = b"\x02"
_TAG_LEAF = b"\x03"
HASH_ALGORITHMS = ("blake3", "sha256", "sha512")
# What vLLM's ImageMediaIO records when loading converted the image (default image_mode and background).
_RGB_IO_CONFIG: dict[str, Any] = {"image_mode": "RGB", "rgba_background_color": (255, 255, 255)}

IMAGE_PART_TYPES = frozenset({"image_url", "input_image"})
MEDIA_PART_TYPES = frozenset({"image_url", "input_image", "image_pil", "image_embeds", "audio_url", "input_audio",
                              "audio_embeds", "video_url", "video_embeds", "prompt_embeds"})  # fmt: skip
MAX_MEDIA_BYTES = 64 * 1024 * 1024
_STEP = 1 << 18  # bytes or base64 characters handled per call in the media thread


class MediaError(TokenizationError):
    """A media item that cannot be loaded or hashed (bad data URL, undecodable image, fetch failure)."""


def _len(n: int) -> bytes:
    return n.to_bytes(8, "little")


def _framed(chunk: bytes) -> Iterator[bytes]:
    yield _len(len(chunk))
    yield chunk


def _leaf(obj: Any) -> Iterator[bytes]:
    if isinstance(obj, bytes | bytearray | memoryview):
        yield from _framed(bytes(obj))
    elif isinstance(obj, str):
        yield from _framed(obj.encode("utf-8"))
    elif isinstance(obj, bool | int | float):
        yield from _framed(np.array(obj).tobytes())  # as vLLM: numpy's default dtype for the scalar
    else:
        raise TypeError(f"cannot hash a {type(obj).__name__}")


def _value(obj: Any) -> Iterator[bytes]:
    if obj is None:
        yield _TAG_NONE
    elif isinstance(obj, list | tuple):
        yield _TAG_SEQUENCE
        yield _len(len(obj))
        for item in obj:
            yield from _value(item)
    elif isinstance(obj, dict):
        yield _TAG_MAPPING
        yield _len(len(obj))
        for k, v in obj.items():
            yield from _framed(str(k).encode("utf-8"))
            yield from _value(v)
    else:
        yield _TAG_LEAF
        yield from _leaf(obj)


def _item(key: str, obj: Any) -> Iterator[bytes]:
    yield from _framed(key.encode("utf-8"))
    yield from _value(obj)


def _hasher(algorithm: str) -> Any:
    if algorithm == "blake3":
        from blake3 import blake3

        return blake3()
    if algorithm in ("sha256", "sha512"):
        return hashlib.new(algorithm)
    raise ValueError(f"unknown mm hash algorithm {algorithm!r}")


def hash_kwargs(algorithm: str, **kwargs: Any) -> str:
    """`MultiModalHasher.hash_kwargs` for plain values (bytes, str, numbers, lists, tuples, dicts)."""
    h = _hasher(algorithm)
    for k, v in sorted(kwargs.items()):
        for chunk in _item(k, v):
            h.update(chunk)
    return str(h.hexdigest())


@dataclass(frozen=True, slots=True)
class MediaWithBytes:
    """vLLM's MediaWithBytes as the hasher sees it: the encoded bytes, and the decode settings that changed it."""

    data: bytes
    io_config: dict[str, Any] | None = None
    image_id: bytes | None = None  # an EXIF ImageID UUID, which replaces the content in the hash


def hash_image(model_id: str, item: MediaWithBytes, algorithm: str = "blake3") -> str:
    """The mm hash vLLM's processor computes for one image loaded from a URL."""
    h = _hasher(algorithm)
    # hash_kwargs(model_id=..., image=item): keys sorted, so "image" then "model_id".
    h.update(b"".join(_framed(b"image")))
    h.update(_TAG_LEAF)
    if item.image_id is not None:
        inner: Iterator[bytes] = _framed(item.image_id)
    elif item.io_config:
        inner = _item("image", {"io_config": item.io_config, "data": item.data})
    else:
        inner = _item("image", item.data)
    for chunk in inner:
        for i in range(0, len(chunk), _STEP):  # in pieces, letting the GIL go between them
            h.update(chunk[i : i + _STEP])
    for chunk in _item("model_id", model_id):
        h.update(chunk)
    return str(h.hexdigest())


# -- images: size, conversion, EXIF (what vLLM's ImageMediaIO.load_bytes decides) ------------------------------


@dataclass(frozen=True, slots=True)
class ImageInfo:
    width: int  # after EXIF orientation, as vLLM's normalize_image
    height: int
    media: MediaWithBytes


_EXIF_ORIENTATION = 0x0112
_EXIF_IMAGE_ID = 0xA420  # ExifTags.Base.ImageID


def inspect_image(data: bytes) -> ImageInfo:
    """Size and hash input of an encoded image, reading only its header (PIL decodes lazily)."""
    from PIL import Image, UnidentifiedImageError

    try:
        img = Image.open(io.BytesIO(data))
        width, height = img.size
        try:
            exif = img.getexif()
            orientation = exif.get(_EXIF_ORIENTATION)
            image_id = exif.get(_EXIF_IMAGE_ID)
        except Exception:  # malformed EXIF: vLLM tolerates it too
            orientation, image_id = None, None
        mode = img.mode
        transparent = mode in ("RGBA", "LA", "PA") or "transparency" in img.info
    except (OSError, UnidentifiedImageError, SyntaxError, RuntimeError, Image.DecompressionBombError) as e:
        raise MediaError(f"Failed to load image: {e}") from None
    if orientation in (5, 6, 7, 8):  # exif_transpose swaps the sides
        width, height = height, width
    if width <= 0 or height <= 0:
        raise MediaError("Failed to load image: empty image")
    id_bytes = image_id.bytes if isinstance(image_id, uuid.UUID) else None
    converted = mode != "RGB" or transparent
    return ImageInfo(width, height, MediaWithBytes(data, dict(_RGB_IO_CONFIG) if converted else None, id_bytes))


# -- placeholders (Qwen2-VL family) ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class VisionConfig:
    """The Qwen2-VL image processor's resize settings and the vision tower's patching."""

    patch_size: int = 14
    merge_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 16384  # Qwen2.5-VL's preprocessor_config.json (12845056)

    @classmethod
    def from_dir(cls, directory: str | Path | None) -> VisionConfig:
        """From a model directory's preprocessor_config.json (`min_pixels`/`max_pixels` or `size`), else defaults."""
        if directory is None:
            return cls()
        path = Path(directory) / "preprocessor_config.json"
        try:
            cfg = json.loads(path.read_text())
        except (OSError, ValueError):
            return cls()
        size = cfg.get("size") if isinstance(cfg.get("size"), dict) else {}
        d = cls()
        return cls(
            patch_size=int(cfg.get("patch_size", d.patch_size)),
            merge_size=int(cfg.get("merge_size", d.merge_size)),
            min_pixels=int(size.get("shortest_edge", cfg.get("min_pixels", d.min_pixels))),
            max_pixels=int(size.get("longest_edge", cfg.get("max_pixels", d.max_pixels))),
        )

    def image_tokens(self, width: int, height: int) -> int:
        h, w = smart_resize(height, width, self.patch_size * self.merge_size, self.min_pixels, self.max_pixels)
        return (h // self.patch_size) * (w // self.patch_size) // (self.merge_size**2)


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Qwen2-VL's resize: sides divisible by `factor`, pixels within [min_pixels, max_pixels], aspect kept."""
    if max(height, width) / min(height, width) > 200:
        raise MediaError(
            f"absolute aspect ratio must be smaller than 200, got {max(height, width) / min(height, width)}"
        )
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


# -- media parts of chat messages ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MediaRef:
    """One media part, in the order the chat template renders them."""

    modality: str
    url: str | None
    uuid: str | None = None


def part_kind(part: Any) -> str | None:
    """A content part's type as vLLM resolves it (a missing type with a direct media field is that field)."""
    if not isinstance(part, dict):
        return None
    kind = part.get("type")
    if kind is None or part.get("uuid") is not None:
        for key in ("image_url", "image_pil", "image_embeds", "audio_embeds", "video_embeds", "prompt_embeds",
                    "audio_url", "input_audio", "video_url"):  # fmt: skip
            if key in part:
                return "input_image" if kind == "input_image" else key
    return kind if isinstance(kind, str) else None


def image_url_of(part: dict[str, Any]) -> str | None:
    """The URL of an `image_url` (`{"url": ...}` or, with a uuid or no type, a bare string) or `input_image` part."""
    value = part.get("image_url")
    if isinstance(value, dict):
        value = value.get("url")
    return value if isinstance(value, str) else None


def media_refs(messages: Sequence[Any]) -> list[MediaRef]:
    """The media parts of `messages` in order. Only images can be expanded locally."""
    out: list[MediaRef] = []
    for i, m in enumerate(messages):
        content = m.get("content") if isinstance(m, dict) else None
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            kind = part_kind(part)
            if kind not in MEDIA_PART_TYPES:
                continue
            assert isinstance(part, dict)
            if kind not in IMAGE_PART_TYPES:
                raise TokenizationError(
                    f"messages[{i}].content[{j}]: {kind} needs the model server's renderer (tokenizer type vllm)"
                )
            uid = part.get("uuid")
            out.append(MediaRef("image", image_url_of(part), None if uid is None else str(uid)))
    return out


def decode_data_url(url: str) -> bytes:
    """A `data:[<type>][;params];base64,<data>` URL's bytes, decoded strictly as vLLM does."""
    spec, sep, payload = url[5:].partition(",")
    if not sep:
        raise MediaError(f"Invalid data URL {url[:32]!r}: missing ',' separator.")
    _, sep, encoding = spec.rpartition(";")
    if not sep or encoding != "base64":
        raise MediaError("Only base64 data URLs are supported.")
    try:
        if len(payload) <= _STEP:
            return base64.b64decode(payload, validate=True)
        # a piece at a time (4-character aligned, so only the last may hold padding): the GIL is let go between
        # pieces, and the event loop thread is not held for the whole decode
        return b"".join(base64.b64decode(payload[i : i + _STEP], validate=True) for i in range(0, len(payload), _STEP))
    except (binascii.Error, ValueError) as e:
        raise MediaError(f"Invalid base64 in data URL: {e}") from None
