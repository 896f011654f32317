"""A Qwen2.5-VL-like simulator's multimodal prompt (`--multimodal`): what vLLM's processor does with image parts.

Chat messages are rendered with the Qwen2.5-VL chat template (image parts as `{"type": "image"}`, text parts as
text), encoded, and each image's `<|image_pad|>` is repeated once per merged 28x28 patch of the image resized by
Qwen2-VL's smart_resize (min 3136, max 12845056 pixels). Each image's mm hash is vLLM's `MultiModalHasher`
digest (blake3) of `model_id=<--model>, image=<MediaWithBytes>`: the encoded bytes, with the io_config vLLM records
when loading converted the image to RGB. The block hashes then carry `("mm", hash, offset in block)` extra keys and
the BlockStored events `(hash, offset)`, as vLLM's. Written from vLLM's code independently of the EPP's
(tests/tokenization/test_multimodal.py checks both against vLLM's own).

Images come as `data:` URLs or `http(s)://` URLs (fetched within 5 s and 32 MiB; no network here, so a refused or
unreachable URL is a prompt 400). Audio and video parts are a 400 (this model takes images only).
"""

from __future__ import annotations

import base64
import binascii
import io
import math
from typing import Any

import numpy as np

from e2e.sim.engine import EngineError

FETCH_TIMEOUT = 5.0
MAX_MEDIA_BYTES = 32 * 1024 * 1024
PATCH, MERGE, MIN_PIXELS, MAX_PIXELS = 14, 2, 3136, 12845056
IMAGE_PAD = "<|image_pad|>"


def _frame(b: bytes) -> bytes:
    return len(b).to_bytes(8, "little") + b


def _serialize(value: Any) -> bytes:
    """vLLM's iter_value_to_bytes: tags 0 none, 1 sequence, 2 mapping, 3 leaf; every chunk length-framed."""
    if value is None:
        return b"\x00"
    if isinstance(value, list | tuple):
        return b"\x01" + len(value).to_bytes(8, "little") + b"".join(_serialize(v) for v in value)
    if isinstance(value, dict):
        body = b"".join(_frame(str(k).encode()) + _serialize(v) for k, v in value.items())
        return b"\x02" + len(value).to_bytes(8, "little") + body
    if isinstance(value, bytes):
        return b"\x03" + _frame(value)
    if isinstance(value, str):
        return b"\x03" + _frame(value.encode())
    if isinstance(value, int | float):
        return b"\x03" + _frame(np.array(value).tobytes())
    raise TypeError(type(value).__name__)


def image_hash(model_id: str, data: bytes, converted: bool) -> str:
    from blake3 import blake3

    item: Any = {"io_config": {"image_mode": "RGB", "rgba_background_color": (255, 255, 255)}, "data": data}
    inner = _frame(b"image") + _serialize(item if converted else data)
    stream = _frame(b"image") + b"\x03" + inner + _frame(b"model_id") + _serialize(model_id)
    return str(blake3(stream).hexdigest())


def image_tokens(width: int, height: int) -> int:
    factor = PATCH * MERGE
    if max(height, width) / min(height, width) > 200:
        raise EngineError(400, "Image aspect ratio must be smaller than 200.")
    h, w = round(height / factor) * factor, round(width / factor) * factor
    if h * w > MAX_PIXELS:
        beta = math.sqrt(height * width / MAX_PIXELS)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < MIN_PIXELS:
        beta = math.sqrt(MIN_PIXELS / (height * width))
        h, w = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return (h // PATCH) * (w // PATCH) // (MERGE * MERGE)


def inspect(data: bytes) -> tuple[int, int, bool]:
    """(width, height) as vLLM sees them (EXIF-transposed) and whether loading converts the image to RGB."""
    from PIL import Image, ImageOps

    try:
        opened = Image.open(io.BytesIO(data))
        opened.load()
        converted = opened.mode != "RGB" or "transparency" in opened.info
        img = ImageOps.exif_transpose(opened) or opened
        return img.size[0], img.size[1], converted
    except Exception as e:  # what vLLM turns into "Failed to load image" (400)
        raise EngineError(400, f"Failed to load image: {e}") from None


async def load(url: Any, session_holder: dict[str, Any]) -> bytes:
    if not isinstance(url, str) or not url:
        raise EngineError(400, "An image part needs a URL.")
    if url[:5].lower() == "data:":
        spec, sep, payload = url[5:].partition(",")
        if not sep or not spec.endswith(";base64"):
            raise EngineError(400, "Only base64 data URLs are supported.")
        try:
            return base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError) as e:
            raise EngineError(400, f"Invalid base64 image data: {e}") from None
    if not url.lower().startswith(("http://", "https://")):
        raise EngineError(400, "Cannot load local files without `--allowed-local-media-path`.")
    import aiohttp

    session = session_holder.get("session")
    if session is None or session.closed:
        session = session_holder["session"] = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=FETCH_TIMEOUT))
    try:
        async with session.get(url) as r:
            if r.status != 200:
                raise EngineError(400, f"Failed to fetch image: HTTP {r.status}")
            data = await r.content.read(MAX_MEDIA_BYTES + 1)
            if len(data) > MAX_MEDIA_BYTES:
                raise EngineError(400, "The image is too large.")
            return bytes(data)
    except (aiohttp.ClientError, TimeoutError) as e:
        raise EngineError(400, f"Failed to fetch image: {e or type(e).__name__}") from None


class VisionRenderer:
    """Chat prompt → token ids with placeholders and the mm items (hash, offset, length)."""

    def __init__(self, model_id: str) -> None:
        from transformers import AutoTokenizer

        from epp.tokenization.qwen import qwen25_vl_tokenizer_dir

        self.model_id = model_id
        self.tok: Any = AutoTokenizer.from_pretrained(str(qwen25_vl_tokenizer_dir()))
        pad = self.tok.convert_tokens_to_ids(IMAGE_PAD)
        assert isinstance(pad, int)
        self.pad = pad
        self._session: dict[str, Any] = {}

    async def render(self, body: dict[str, Any]) -> tuple[list[int], list[tuple[str, int, int]]]:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise EngineError(400, "`messages` must be a non-empty list of message objects")
        convo: list[dict[str, Any]] = []
        images: list[tuple[str, int]] = []
        for m in messages:
            if not isinstance(m.get("role"), str):
                raise EngineError(400, "every message needs a string `role`")
            content = m.get("content")
            if content is None or isinstance(content, str):
                convo.append({"role": m["role"], "content": content or ""})
                continue
            if not isinstance(content, list):
                raise EngineError(400, "message `content` must be a string or a list of content parts")
            parts: list[dict[str, Any]] = []
            for part in content:
                kind = part.get("type") if isinstance(part, dict) else None
                if kind == "text" and isinstance(part.get("text"), str):
                    parts.append({"type": "text", "text": part["text"]})
                elif kind in ("image_url", "input_image"):
                    url = part.get("image_url")
                    url = url.get("url") if isinstance(url, dict) else url
                    data = await load(url, self._session)
                    w, h, converted = inspect(data)
                    images.append((image_hash(self.model_id, data, converted), image_tokens(w, h)))
                    parts.append({"type": "image"})
                elif kind in ("audio_url", "input_audio", "video_url"):
                    raise EngineError(400, f"This model does not support {kind} input.")
                else:
                    raise EngineError(400, f"Unsupported content part type: {str(kind)[:40]!r}")
            convo.append({"role": m["role"], "content": parts})
        text = self.tok.apply_chat_template(convo, tokenize=False, add_generation_prompt=True)
        ids = list(self.tok.encode(text, add_special_tokens=False))
        out: list[int] = []
        items: list[tuple[str, int, int]] = []
        k = 0
        for t in ids:
            if t == self.pad:
                if k >= len(images):
                    raise EngineError(400, "More image placeholders in the prompt than images.")
                digest, count = images[k]
                items.append((digest, len(out), count))
                out.extend([self.pad] * count)
                k += 1
            else:
                out.append(t)
        if k != len(images):
            raise EngineError(400, "Fewer image placeholders in the prompt than images.")
        return out, items

    async def close(self) -> None:
        session = self._session.get("session")
        if session is not None:
            await session.close()
