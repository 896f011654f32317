"""Malformed media parts are a 400 in each API's error shape (the parsers' media check), well-formed ones pass."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from epp.framework.errors import BadRequest
from epp.wiring.builtins import default_parsers

DEFAULT = default_parsers()
PNG = "data:image/png;base64,iVBORw0KGgo="


def parse(path: str, body: dict[str, Any]) -> Any:
    return DEFAULT.resolve(path).parse({":path": path, ":method": "POST"}, json.dumps(body).encode())


def chat(part: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, part]}]}


@pytest.mark.parametrize(
    "part",
    [
        {"type": "image_url", "image_url": {"url": PNG}},
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png", "detail": "auto"}},
        {"image_url": PNG},  # no type: vLLM takes the direct field
        {"type": "image_url", "image_url": None, "uuid": "cached-item"},
        {"type": "video_url", "video_url": {"url": "http://example.com/v.mp4"}},
        {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
    ],
)
def test_well_formed_media_parts_pass(part: dict[str, Any]) -> None:
    assert parse("/v1/chat/completions", chat(part)).messages is not None


@pytest.mark.parametrize(
    ("part", "fragment"),
    [
        ({"type": "image_url", "image_url": "data:image/png;base64,AAAA"}, "must be an object with a url"),
        ({"type": "image_url", "image_url": {}}, "must be a non-empty string"),
        ({"type": "image_url", "image_url": {"url": 7}}, "must be a non-empty string"),
        ({"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}, "invalid base64"),
        ({"type": "image_url", "image_url": {"url": "data:image/png;base64,"}}, "empty base64"),
        ({"type": "image_url", "image_url": {"url": "data:image/png,raw"}}, "only base64"),
        ({"type": "image_url", "image_url": {"url": "data:image/png;base64"}}, "missing ','"),
        ({"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}, "unsupported URL scheme"),
        ({"type": "audio_url", "audio_url": {"url": "ftp://x/a.wav"}}, "unsupported URL scheme"),
        ({"type": "input_audio", "input_audio": {"data": "@@", "format": "wav"}}, "invalid base64"),
        ({"type": "input_audio", "input_audio": "x"}, "input_audio must be an object"),
    ],
)
def test_malformed_media_parts_are_openai_400s(part: dict[str, Any], fragment: str) -> None:
    parser = DEFAULT.resolve("/v1/chat/completions")
    with pytest.raises(BadRequest) as e:
        parse("/v1/chat/completions", chat(part))
    assert fragment in e.value.message and "messages[0].content[1]" in e.value.message
    err = json.loads(e.value.body(parser.error_format))["error"]
    assert err["message"].endswith(e.value.message) and err["code"] == 400


def test_responses_input_image() -> None:
    ok = {"model": "m", "input": [{"role": "user", "content": [{"type": "input_image", "image_url": PNG}]}]}
    assert parse("/v1/responses", ok).messages
    bad = {"model": "m", "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:x"}]}]}
    with pytest.raises(BadRequest, match=r"input\[0\]\.content\[0\]\.image_url: invalid data URL"):
        parse("/v1/responses", bad)


def test_anthropic_image_blocks_in_anthropic_shape() -> None:
    def msg(source: Any) -> dict[str, Any]:
        block = {"type": "image", "source": source}
        return {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": [block]}]}

    got = parse("/v1/messages", msg({"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}))
    assert got.messages[0]["content"] == [{"type": "image_url", "image_url": {"url": PNG}}]
    parser = DEFAULT.resolve("/v1/messages")
    for source, fragment in (
        ({"type": "base64", "media_type": "image/png", "data": "not base64!"}, "invalid base64"),
        ({"type": "base64", "media_type": "image/png"}, "empty base64"),
        ({"type": "url", "url": "gopher://x"}, "unsupported URL scheme"),
    ):
        with pytest.raises(BadRequest) as e:
            parse("/v1/messages", msg(source))
        assert fragment in e.value.message
        assert json.loads(e.value.body(parser.error_format))["type"] == "error"


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=12),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
    max_leaves=8,
)
_kinds = st.sampled_from(["image_url", "input_image", "audio_url", "video_url", "input_audio", "text", None])
_urls = st.one_of(
    st.text(max_size=20),
    st.builds(lambda a, b: f"data:{a};base64,{b}", st.text(max_size=8), st.text(max_size=16)),
    st.sampled_from(["http://x/a.png", "https://x", "file:///a", "data:,", "data:image/png;base64,===="]),
)


@settings(max_examples=300, deadline=None)
@given(
    kind=_kinds,
    value=st.one_of(_json, _urls, st.fixed_dictionaries({"url": st.one_of(_urls, _json)})),
    extra=st.dictionaries(st.sampled_from(["uuid", "file_id", "detail"]), _json, max_size=2),
)
def test_media_check_fuzz_never_crashes(kind: str | None, value: Any, extra: dict[str, Any]) -> None:
    part: dict[str, Any] = {**extra, **({"type": kind} if kind else {})}
    part[kind or "image_url"] = value
    with contextlib.suppress(BadRequest):  # a ParsedRequest or a 400, nothing else
        parse("/v1/chat/completions", chat(part))


def test_media_parts_are_bounded_as_vllms_default_limit() -> None:
    url = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
    parts: list[dict[str, Any]] = [url] * 999
    body = {"model": "m", "messages": [{"role": "user", "content": parts}]}
    assert parse("/v1/chat/completions", body).messages
    parts.append(url)
    with pytest.raises(BadRequest, match="at most 999 media items"):
        parse("/v1/chat/completions", body)
