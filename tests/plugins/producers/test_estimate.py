"""token-producer's `estimate` backend: byte packing, multimodal placeholder estimates (image, video, audio), the
per-API input (chat, Anthropic messages, completions, JSON APIs), pre-tokenized passthrough, and its parameters."""

from __future__ import annotations

import asyncio
import base64
import struct
import zlib
from typing import Any

import pytest
import xxhash

from epp.config.loader import ConfigError, parse_config
from epp.datalayer.datastore import Datastore
from epp.framework import TOKENIZED_PROMPT, ApiKind, InferenceRequest, PluginConfigError, TokenizedPrompt
from epp.framework.types import MultiModalFeature
from epp.plugins.producers._estimate import image_dimensions_from_payload
from epp.plugins.producers.token_producer import TokenProducer
from epp.wiring import build_pipeline, plugin_context
from tests.helpers import build


def le32(chunk: bytes) -> int:
    return int.from_bytes(chunk.ljust(4, b"\0"), "little")


def packed(raw: bytes) -> list[int]:
    return [le32(raw[i : i + 4]) for i in range(0, len(raw), 4)]


def png(width: int, height: int) -> bytes:
    """A real PNG (RGB, one black pixel row per line)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    rows = b"".join(b"\0" + bytes(3 * width) for _ in range(height))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def jpeg_header(width: int, height: int) -> bytes:
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\0\x01\x01\0\0\x01\0\x01\0\0"
    exif = (b"\xff\xe1" + struct.pack(">H", 40000) + bytes(40000 - 2)) * 2  # pushes SOF past the first chunk
    sof = b"\xff\xc0" + struct.pack(">HBHHB", 17, 8, height, width, 3) + bytes(9)
    return b"\xff\xd8" + app0 + exif + sof + b"\xff\xd9"


def data_url(raw: bytes, kind: str = "png") -> str:
    return f"data:image/{kind};base64," + base64.b64encode(raw).decode()


def estimate(request: InferenceRequest, parameters: dict[str, Any] | None = None) -> TokenizedPrompt:
    producer = build(TokenProducer, {"estimate": parameters or {}})
    asyncio.run(producer.prepare(request, []))
    return request.data.require(TOKENIZED_PROMPT)


def chat(messages: list[dict[str, Any]], headers: dict[str, str] | None = None, **body: Any) -> InferenceRequest:
    return InferenceRequest(
        "r", "/v1/chat/completions", ApiKind.CHAT, "m", "m", {"messages": messages, **body}, headers=headers or {},
        messages=messages,
    )  # fmt: skip


def test_text_is_packed_four_bytes_a_token() -> None:
    r = InferenceRequest("r", "/v1/completions", ApiKind.COMPLETIONS, "m", "m", {}, prompt="abcdefghij")
    assert estimate(r).token_ids == packed(b"abcdefghij") == [le32(b"abcd"), le32(b"efgh"), le32(b"ij")]
    r = chat([{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "é"}]}])
    assert estimate(r).token_ids == packed("systemBe brief.useré".encode())
    tools = [{"type": "function", "function": {"name": "f", "description": "a<b"}}]
    r = chat([{"role": "user", "content": "x"}], tools=tools)  # Go's json.Marshal: compact, sorted, <>& escaped
    raw = b'[{"function":{"description":"a\\u003cb","name":"f"},"type":"function"}]userx'
    assert estimate(r).token_ids == packed(raw)


def test_pre_tokenized_input_passes_through() -> None:
    feats = [MultiModalFeature("image", "ab", 3, 4)]
    r = InferenceRequest(
        "r", "/inference/v1/generate", ApiKind.OTHER, "m", "m", {}, token_ids=[5, 6, 7], mm_features=feats
    )
    got = estimate(r)
    assert got.token_ids == [5, 6, 7] and got.mm_features == feats
    r = InferenceRequest("r", "/v1/completions", ApiKind.COMPLETIONS, "m", "m", {}, prompt=[11, 12])
    assert estimate(r).token_ids == [11, 12]
    r = InferenceRequest("r", "/v1/embeddings", ApiKind.EMBEDDINGS, "m", "m", {"input": [1, 2, 3]})
    assert estimate(r).token_ids == [1, 2, 3]
    r = InferenceRequest("r", "/v1/embeddings", ApiKind.EMBEDDINGS, "m", "m", {"input": "hello"})
    assert estimate(r).token_ids == packed(b'"hello"')


def test_json_apis_are_packed_as_their_json() -> None:
    body = {"instructions": "be nice", "input": [{"role": "user", "content": "hi"}]}
    r = InferenceRequest("r", "/v1/responses", ApiKind.RESPONSES, "m", "m", body)
    raw = b'[{"instructions":"be nice"},{"input":[{"content":"hi","role":"user"}]}]'
    assert estimate(r).token_ids == packed(raw)
    r = InferenceRequest("r", "/v1/conversations", ApiKind.CONVERSATIONS, "m", "m", {"items": [{"b": 1, "a": 2}]})
    assert estimate(r).token_ids == packed(b'[{"a":2,"b":1}]')


def test_images_get_placeholder_runs_sized_by_their_dimensions() -> None:
    url = data_url(png(64, 48))
    assert image_dimensions_from_payload(base64.b64encode(png(64, 48)).decode()) == (64, 48)
    r = chat(
        [
            {
                "role": "user",
                "content": [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": url}}],
            }
        ]
    )
    got = estimate(r, {"image": {"dynamic": {"factor": 256}}})
    n = 64 * 48 // 256  # 12 placeholder tokens
    digest = xxhash.xxh64_intdigest(url.encode())
    assert got.mm_features == [MultiModalFeature("image", format(digest, "x"), 2, n)]  # "userhi" aligned to 8 bytes
    assert got.token_ids == packed(b"userhi\0\0") + [digest & 0xFFFFFFFF] * n
    # an image whose size cannot be read: the default resolution (llm-d: 640x360, here the guide's 1280x720)
    remote = chat([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/cat.png"}}]}])
    e_p_d = {
        "image": {"mode": "dynamic", "defaultResolution": {"width": 1280, "height": 720}, "dynamic": {"factor": 1024}}
    }
    assert estimate(remote, e_p_d).mm_features[0].length == 900  # type: ignore[index]
    remote.data.pop(TOKENIZED_PROMPT)
    assert estimate(remote).mm_features[0].length == 640 * 360 // 1024  # type: ignore[index]
    remote.data.pop(TOKENIZED_PROMPT)
    assert estimate(remote, {"image": {"mode": "static", "static": {"staticToken": 256}}}).mm_features[0].length == 256  # type: ignore[index]
    jpg = chat(
        [
            {
                "role": "user",
                "content": [{"type": "image_url", "image_url": {"url": data_url(jpeg_header(2048, 1024), "jpeg")}}],
            }
        ]
    )
    assert estimate(jpg).mm_features[0].length == 2048  # type: ignore[index]  # SOF found past 80 kB of segments
    gif = chat(
        [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": data_url(b"GIF89a\x00\x02\x00\x01" + bytes(8), "gif")}}
                ],
            }
        ]
    )
    assert estimate(gif).mm_features[0].length == 512 * 256 // 1024  # type: ignore[index]


def video_request(headers: dict[str, str] | None = None) -> InferenceRequest:
    block = {"type": "video_url", "video_url": {"url": "https://x/clip.mp4"}}
    return chat([{"role": "user", "content": [block]}], headers=headers)


@pytest.mark.parametrize(
    ("params", "headers", "tokens"),
    [
        ({}, {}, 20 * (640 * 360 // 1024)),  # 10 s at 2 fps, 225 tokens a 640x360 frame
        ({}, {"x-llm-d-video-duration-seconds": "4", "x-llm-d-video-resolution": "320x240"}, 8 * 75),
        ({}, {"x-llm-d-video-duration-seconds": "soon", "x-llm-d-video-resolution": "big"}, 20 * 225),  # ignored
        (  # qwen3-vl: sampled at 2 fps, frame pairs merged
            {"frames": {"sampled": {"sampleFPS": 2, "temporalPatchSize": 2}, "maxFrames": 16}},
            {"x-llm-d-video-duration-seconds": "30"},
            8 * 225,
        ),
        (  # gemma: every 12th source frame, 70 tokens each, capped
            {"tokensPerFrame": {"mode": "static", "static": {"numTokensPerFrame": 70}},
             "frames": {"mode": "strided", "strided": {"frameStride": 12}}},
            {},
            20 * 70,
        ),
        (
            {"tokensPerFrame": {"mode": "static", "static": {"numTokensPerFrame": 70}},
             "frames": {"mode": "strided", "strided": {"frameStride": 12}}, "maxVideoTokens": 1000},
            {"x-llm-d-video-fps": "48"},
            1000,
        ),
        ({"defaultDuration": 3, "frames": {"minFrames": 10}}, {}, 10 * 225),
    ],
)  # fmt: skip
def test_video_placeholders(params: dict[str, Any], headers: dict[str, str], tokens: int) -> None:
    got = estimate(video_request(headers), {"video": params})
    assert got.mm_features is not None and got.mm_features[0].modality == "video"
    assert got.mm_features[0].length == tokens


def test_audio_placeholders() -> None:
    block = {"type": "input_audio", "input_audio": {"data": "QUJDREVGRw==", "format": "wav"}}
    got = estimate(chat([{"role": "user", "content": [block]}]))
    assert got.mm_features == [
        MultiModalFeature("audio", format(xxhash.xxh64_intdigest(b"QUJDREVGRw==wav"), "x"), 1, 4)  # ceil(15 / 4)
    ]


def test_anthropic_messages() -> None:
    body = {
        "system": [{"type": "text", "text": "x-anthropic-billing-header: cc=1"}, {"type": "text", "text": "Sys."}],
        "messages": [
            {"role": "user", "content": "Q"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "hm"},
                {"type": "tool_use", "id": "t1", "name": "get", "input": {"k": 1}},
            ]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [
                {"type": "text", "text": "a"}, {"type": "text", "text": "b"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                             "data": base64.b64encode(png(32, 32)).decode()}},
            ]}]},
        ],
    }  # fmt: skip
    r = InferenceRequest("r", "/v1/messages", ApiKind.MESSAGES, "m", "m", body)
    got = estimate(r, {"image": {"dynamic": {"factor": 64}}})
    text = b'Sys.userQassistanthmt1get{"k":1}usera\nb'
    assert got.token_ids[: len(text) // 4] == packed(text)[: len(text) // 4]
    assert got.mm_features is not None and got.mm_features[0].offset == -(-len(text) // 4)
    assert got.mm_features[0].length == 16  # 32x32 / 64


def test_parameters() -> None:
    with pytest.raises(PluginConfigError, match=r"estimate.*only one of"):
        build(TokenProducer, {"estimate": {}, "modelName": "m"})
    with pytest.raises(PluginConfigError, match="mode"):
        build(TokenProducer, {"estimate": {"image": {"mode": "fancy"}}})
    with pytest.raises(PluginConfigError, match="mode"):
        build(TokenProducer, {"estimate": {"video": {"frames": {"mode": "all"}}}})
    ds = Datastore()
    with pytest.raises(ConfigError, match=r"estimate\.image\.dynamic\.factr"):
        build_pipeline(
            parse_config("plugins:\n- type: token-producer\n  parameters: {estimate: {image: {dynamic: {factr: 3}}}}"),
            plugin_context(ds),
        )
    p = build(TokenProducer, {"estimate": {}})
    assert p.tokenizer is None and p.estimator is not None
