"""token-producer's `estimate` backend (llm-d): pseudo tokens without a tokenizer.

The request's text is packed 4 bytes a token (little-endian, the tail zero-padded), so a block of N pseudo tokens
covers the bytes an N-token block of the approximate producer covers and the count is ≈ the prompt's length.
Multimodal items become placeholder runs on a token boundary: the item's content hash (xxhash64, low 32 bits)
repeated as many times as the model would spend tokens on it, reported as a MultiModalFeature (hash, offset,
length). Images: width·height/factor (dimensions read from a base64 PNG/JPEG/GIF header, else the default
resolution) or a static count; videos: min(frames·tokensPerFrame, maxVideoTokens) with duration, resolution and
source fps from the `x-llm-d-video-*` headers, else the config, else the defaults; audio: ⌈bytes/4⌉. What goes in
per API follows llm-d-router v0.10's estimate.go: chat = tools JSON, then role + text per message; Anthropic
messages = tools, system, then role + text/thinking/tool_use/tool_result per message; completions = the prompt;
responses/conversations/embeddings = their JSON. Pre-tokenized input passes through. The ids never match engine
tokens: they serve content locality and lengths, not the precise (engine-correlated) prefix index.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import xxhash

from epp.framework import ApiKind, InferenceRequest, Params, TokenizedPrompt
from epp.framework.keys import BILLING_HEADER_PREFIX
from epp.framework.types import MultiModalFeature

BYTES_PER_TOKEN = 4
DEFAULT_WIDTH, DEFAULT_HEIGHT = 640, 360
TOKEN_FACTOR = 1024
DEFAULT_VIDEO_DURATION = 10.0
DEFAULT_SAMPLE_FPS = 2.0
DEFAULT_SOURCE_FPS = 24.0
DYNAMIC, STATIC = "dynamic", "static"
SAMPLED, STRIDED = "sampled", "strided"
VIDEO_FPS_HEADER = "x-llm-d-video-fps"
VIDEO_DURATION_HEADER = "x-llm-d-video-duration-seconds"
VIDEO_RESOLUTION_HEADER = "x-llm-d-video-resolution"
_HEADER_CHUNK = 64 * 1024  # base64 characters decoded at a time while looking for an image's dimensions


@dataclass(frozen=True, slots=True)
class ImageEstimator:
    mode: str = DYNAMIC
    width: int = 0
    height: int = 0
    factor: int = 0
    static_tokens: int = 0

    def count(self, url: str) -> int:
        return self.count_dims(image_dimensions_from_url(url))

    def count_dims(self, dims: tuple[int, int] | None) -> int:
        """Always >= 1, so every image carries weight."""
        if self.mode == STATIC:
            return self.static_tokens if self.static_tokens > 0 else 1
        w, h = dims if dims is not None else (self.width or DEFAULT_WIDTH, self.height or DEFAULT_HEIGHT)
        return max(1, (w * h) // (self.factor or TOKEN_FACTOR))


@dataclass(frozen=True, slots=True)
class VideoMeta:
    """The x-llm-d-video-* headers of a request; 0 = not given."""

    width: int = 0
    height: int = 0
    duration: float = 0.0
    fps: float = 0.0


@dataclass(frozen=True, slots=True)
class VideoEstimator:
    tpf_mode: str = DYNAMIC
    factor: int = 0
    static_tokens: int = 0
    frames_mode: str = SAMPLED
    sample_fps: float = 0.0
    source_fps: float = 0.0
    frame_stride: int = 0
    min_frames: int = 0
    max_frames: int = 0
    temporal_patch: int = 0
    width: int = 0
    height: int = 0
    duration: float = 0.0
    max_tokens: int = 0

    def count(self, meta: VideoMeta) -> int:
        tokens = self.frames(meta) * self.tokens_per_frame(meta)
        if self.max_tokens > 0:
            tokens = min(tokens, self.max_tokens)
        return max(1, tokens)

    def _clamp(self, n: int) -> int:
        if self.min_frames > 0:
            n = max(n, self.min_frames)
        if self.max_frames > 0:
            n = min(n, self.max_frames)
        return n

    def frames(self, meta: VideoMeta) -> int:
        duration = meta.duration or self.duration or DEFAULT_VIDEO_DURATION
        if self.frames_mode == STRIDED:
            fps = meta.fps or self.source_fps or DEFAULT_SOURCE_FPS
            return self._clamp(int(duration * fps) // max(1, self.frame_stride))
        n = self._clamp(int(duration * (self.sample_fps or DEFAULT_SAMPLE_FPS)))  # sampleFPS: the model's, no header
        return n // self.temporal_patch if self.temporal_patch > 1 else n

    def tokens_per_frame(self, meta: VideoMeta) -> int:
        if self.tpf_mode == STATIC:
            return self.static_tokens if self.static_tokens > 0 else 1
        w, h = (meta.width, meta.height) if meta.width > 0 and meta.height > 0 else (self.width, self.height)
        return max(1, ((w or DEFAULT_WIDTH) * (h or DEFAULT_HEIGHT)) // (self.factor or TOKEN_FACTOR))


def _resolution(p: Params) -> tuple[int, int]:
    sec = p.section("defaultResolution")
    return sec.int("width", 0, min=0), sec.int("height", 0, min=0)


def estimators_from_params(p: Params) -> tuple[ImageEstimator, VideoEstimator]:
    """The `estimate` section: `image` and `video` tunables, llm-d's names; unset ones take the defaults."""
    img = p.section("image")
    iw, ih = _resolution(img)
    image = ImageEstimator(
        mode=img.str("mode", DYNAMIC, choices=(DYNAMIC, STATIC)),
        width=iw,
        height=ih,
        factor=img.section("dynamic").int("factor", 0, min=0),
        static_tokens=img.section("static").int("staticToken", 0, min=0),
    )
    vid = p.section("video")
    vw, vh = _resolution(vid)
    tpf = vid.section("tokensPerFrame")
    frames = vid.section("frames")
    sampled, strided = frames.section("sampled"), frames.section("strided")
    video = VideoEstimator(
        tpf_mode=tpf.str("mode", DYNAMIC, choices=(DYNAMIC, STATIC)),
        factor=tpf.section("dynamic").int("factor", 0, min=0),
        static_tokens=tpf.section("static").int("numTokensPerFrame", 0, min=0),
        frames_mode=frames.str("mode", SAMPLED, choices=(SAMPLED, STRIDED)),
        sample_fps=sampled.float("sampleFPS", 0.0, min=0.0),
        temporal_patch=sampled.int("temporalPatchSize", 0, min=0),
        source_fps=strided.float("defaultSourceFPS", 0.0, min=0.0),
        frame_stride=strided.int("frameStride", 0, min=0),
        min_frames=frames.int("minFrames", 0, min=0),
        max_frames=frames.int("maxFrames", 0, min=0),
        width=vw,
        height=vh,
        duration=vid.float("defaultDuration", 0.0, min=0.0),
        max_tokens=vid.int("maxVideoTokens", 0, min=0),
    )
    return image, video


def _positive_float(raw: str | None) -> float:
    try:
        v = float(raw) if raw else 0.0
    except ValueError:
        return 0.0
    return v if math.isfinite(v) and v > 0 else 0.0


def video_meta(headers: Mapping[str, str]) -> VideoMeta:
    """Malformed or missing values stay 0 (the estimator falls back per field)."""
    w = h = 0
    res = headers.get(VIDEO_RESOLUTION_HEADER, "")
    i = min((j for j in (res.find("x"), res.find("X")) if j >= 0), default=-1)
    if i > 0:
        try:
            w, h = int(res[:i].strip()), int(res[i + 1 :].strip())
        except ValueError:
            w = h = 0
        if w <= 0 or h <= 0:
            w = h = 0
    return VideoMeta(
        w, h, _positive_float(headers.get(VIDEO_DURATION_HEADER)), _positive_float(headers.get(VIDEO_FPS_HEADER))
    )


# -- image headers (the formats Go's image.DecodeConfig reads there: PNG, GIF, JPEG) -------------------------------


_MORE = (-1, -1)  # the header goes on past the bytes decoded so far


def _dims_from_header(data: bytes) -> tuple[int, int] | None:
    """(w, h); None when not an image we read; _MORE when more bytes are needed."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        if len(data) < 24:
            return _MORE
        return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    if data[:6] in (b"GIF87a", b"GIF89a"):
        if len(data) < 10:
            return _MORE
        return int.from_bytes(data[6:8], "little"), int.from_bytes(data[8:10], "little")
    if data[:2] == b"\xff\xd8":
        i = 2
        while True:
            if i + 4 > len(data):
                return _MORE
            if data[i] != 0xFF:
                return None
            marker = data[i + 1]
            if marker == 0xFF:  # fill byte
                i += 1
                continue
            if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:  # no length
                i += 2
                continue
            length = int.from_bytes(data[i + 2 : i + 4], "big")
            if marker in (0xC0, 0xC1, 0xC2):  # the frame header (baseline, extended, progressive)
                if i + 9 > len(data):
                    return _MORE
                return int.from_bytes(data[i + 7 : i + 9], "big"), int.from_bytes(data[i + 5 : i + 7], "big")
            if length < 2:
                return None
            i += 2 + length
    return None


def image_dimensions_from_payload(b64: str) -> tuple[int, int] | None:
    """Dimensions of a base64 image, decoding only as much as its header needs."""
    end = 0
    while True:
        end = min(len(b64), end + _HEADER_CHUNK)
        chunk = b64[: end - end % 4] if end < len(b64) else b64
        try:
            data = base64.b64decode(chunk, validate=True)
        except (binascii.Error, ValueError):
            return None
        got = _dims_from_header(data)
        if got is _MORE:
            if end >= len(b64):
                return None
            continue
        if got is None:
            return None
        w, h = got
        return (w, h) if w > 0 and h > 0 else None


def image_dimensions_from_url(url: str) -> tuple[int, int] | None:
    if not url.startswith("data:image/") or "base64," not in url:
        return None
    return image_dimensions_from_payload(url[url.index("base64,") + len("base64,") :])


# -- packing -----------------------------------------------------------------------------------------------------


def _go_json(value: Any) -> bytes:
    """Go's json.Marshal of decoded JSON: compact, keys sorted, <>& escaped."""
    s = json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False, default=str)
    return s.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026").encode("utf-8", "surrogatepass")


def _align(out: bytearray) -> None:
    if r := len(out) % BYTES_PER_TOKEN:
        out.extend(bytes(BYTES_PER_TOKEN - r))


def pack(raw: bytes | bytearray) -> list[int]:
    """Little-endian uint32 pseudo tokens (zero-padded tail)."""
    if not raw:
        return []
    buf = bytearray(raw)
    _align(buf)
    ids: list[int] = np.frombuffer(bytes(buf), dtype="<u4").tolist()
    return ids


@dataclass(slots=True)
class _Stream:
    out: bytearray = field(default_factory=bytearray)
    features: list[MultiModalFeature] = field(default_factory=list)

    def text(self, s: Any) -> None:
        if isinstance(s, str) and s:
            self.out += s.encode("utf-8", "surrogatepass")

    def asset(self, modality: str, content: str, count: int) -> None:
        _align(self.out)
        offset = len(self.out) // BYTES_PER_TOKEN
        digest = xxhash.xxh64_intdigest(content.encode("utf-8", "surrogatepass"))
        self.out += (digest & 0xFFFFFFFF).to_bytes(4, "little") * count
        self.features.append(MultiModalFeature(modality, format(digest, "x"), offset, count))


def _dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def _blocks(content: Any) -> list[dict[str, Any]]:
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


@dataclass(frozen=True, slots=True)
class EstimateBackend:
    image: ImageEstimator = ImageEstimator()
    video: VideoEstimator = VideoEstimator()

    def estimate(self, request: InferenceRequest) -> TokenizedPrompt | None:
        """The request's pseudo tokens (and multimodal features); None for an API with nothing to estimate."""
        if request.token_ids is not None:
            return TokenizedPrompt(list(request.token_ids), request.mm_features)
        body = request.body
        if request.api == ApiKind.MESSAGES:
            s = self._anthropic(body)
            return TokenizedPrompt(pack(s.out), s.features or None)
        if request.api == ApiKind.CHAT or (request.messages is not None and request.api != ApiKind.RESPONSES):
            s = self._chat(body, request.messages, request.headers)
            return TokenizedPrompt(pack(s.out), s.features or None)
        if request.api == ApiKind.COMPLETIONS:
            prompt = request.prompt if request.prompt is not None else body.get("prompt")
            return TokenizedPrompt(_completion_tokens(prompt))
        raw: bytes
        if request.api == ApiKind.CONVERSATIONS:
            raw = _go_json(body.get("items"))
        elif request.api == ApiKind.RESPONSES:
            combined: list[dict[str, Any]] = []
            if body.get("instructions") is not None:
                combined.append({"instructions": body["instructions"]})
            if body.get("tools") is not None:
                combined.append({"tools": body["tools"]})
            combined.append({"input": body.get("input")})
            raw = _go_json(combined)
        elif request.api == ApiKind.EMBEDDINGS:
            inp = body.get("input")
            if isinstance(inp, list) and _is_token_ids(inp):
                return TokenizedPrompt(list(inp))
            raw = _go_json(inp)
        else:
            return None
        return TokenizedPrompt(pack(raw))

    @staticmethod
    def _messages(s: _Stream, messages: Any, block: Callable[[dict[str, Any]], None]) -> None:
        """Each message's role, then its text content or each of its content blocks."""
        for msg in messages if isinstance(messages, list) else []:
            if not isinstance(msg, dict):
                continue
            s.text(msg.get("role"))
            content = msg.get("content")
            if isinstance(content, str) and content:
                s.text(content)
                continue
            for b in _blocks(content):
                block(b)

    def _chat(
        self, body: Mapping[str, Any], messages: list[dict[str, Any]] | None, headers: Mapping[str, str]
    ) -> _Stream:
        s = _Stream()
        if tools := body.get("tools"):
            s.out += _go_json(tools)

        def block(b: dict[str, Any]) -> None:
            kind = b.get("type")
            if kind == "text":
                s.text(b.get("text"))
            elif kind == "image_url":
                url = str(_dict(b.get("image_url")).get("url") or "")
                s.asset("image", url, self.image.count(url))
            elif kind == "video_url":
                url = str(_dict(b.get("video_url")).get("url") or "")
                s.asset("video", url, self.video.count(video_meta(headers)))
            elif kind in ("input_audio", "audio_url"):
                audio = _dict(b.get("input_audio"))
                data = str(audio.get("data") or "") + str(audio.get("format") or "")
                s.asset("audio", data, max(1, -(-len(data.encode("utf-8", "surrogatepass")) // BYTES_PER_TOKEN)))

        self._messages(s, messages if messages is not None else body.get("messages"), block)
        return s

    def _anthropic_image(self, s: _Stream, src: Any) -> None:
        src = _dict(src)
        if src.get("url"):
            url = str(src["url"])
            s.asset("image", url, self.image.count(url))
        elif src.get("data"):
            data = str(src["data"])
            s.asset("image", data, self.image.count_dims(image_dimensions_from_payload(data)))

    def _anthropic(self, body: Mapping[str, Any]) -> _Stream:
        s = _Stream()
        if tools := body.get("tools"):
            s.out += _go_json(tools)
        s.text(_anthropic_system(body.get("system")))

        def block(b: dict[str, Any]) -> None:
            kind = b.get("type")
            if kind == "text":
                s.text(b.get("text"))
            elif kind == "image":
                self._anthropic_image(s, b.get("source"))
            elif kind == "thinking":
                s.text(b.get("thinking"))
            elif kind == "tool_use":
                s.text(b.get("id"))
                s.text(b.get("name"))
                if "input" in b:
                    s.out += json.dumps(b["input"], separators=(",", ":"), ensure_ascii=False).encode(
                        "utf-8", "surrogatepass"
                    )
            elif kind == "tool_result":
                self._tool_result(s, b.get("content"))

        self._messages(s, body.get("messages"), block)
        return s

    def _tool_result(self, s: _Stream, content: Any) -> None:
        if isinstance(content, str):
            s.text(content)
            return
        texts: list[str] = []
        images: list[str] = []
        for item in _blocks(content):
            if item.get("type") == "text":
                texts.append(str(item.get("text") or ""))
            elif item.get("type") == "image" and (url := _anthropic_image_url(item.get("source"))):
                images.append(url)
        s.text("\n".join(texts))
        for url in images:
            s.asset("image", url, self.image.count(url))


def _anthropic_system(system: Any) -> str:
    if isinstance(system, str):
        return system
    return "".join(
        str(b.get("text"))
        for b in _blocks(system)
        if b.get("type") == "text" and b.get("text") and not str(b["text"]).startswith(BILLING_HEADER_PREFIX)
    )


def _anthropic_image_url(src: Any) -> str:
    src = _dict(src)
    if src.get("type") == "url" or src.get("url"):
        return str(src.get("url") or "")
    if not src.get("data"):
        return ""
    return f"data:{src.get('media_type') or 'image/jpeg'};base64,{src['data']}"


def _is_token_ids(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(t, int) and not isinstance(t, bool) for t in v)


def _completion_tokens(prompt: Any) -> list[int]:
    """A string is packed; token ids pass through; several prompts are packed one after the other."""
    if isinstance(prompt, str):
        return pack(prompt.encode("utf-8", "surrogatepass"))
    if _is_token_ids(prompt):
        return list(prompt)
    if isinstance(prompt, list):
        out: list[int] = []
        for p in prompt:
            out += _completion_tokens(p)
        return out
    return []
