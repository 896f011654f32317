"""Media content parts of chat messages, checked as vLLM's request validation checks them, so a malformed image part
is a 400 in the API's own error shape here rather than a request the model server refuses (or the EPP mis-hashes).

- `image_url` / `audio_url` / `video_url`: an object with a non-empty string `url` (a bare string only for a part
  without `type` or with a `uuid`, as vLLM accepts); `input_image` (Responses): a string `image_url`;
  `input_audio`: an object with string `data` and `format`.
- At most 999 media parts (vLLM's default `--limit-mm-per-prompt` per modality, applied to all of them here).
- URLs: `data:` (RFC 2397, base64 only, strictly valid and non-empty, as vLLM decodes them), `http(s)://`; anything
  else (file://, ftp://, a bare path) is refused, as vLLM refuses it without `--allowed-local-media-path`.
"""

from __future__ import annotations

import binascii
from collections.abc import Sequence
from typing import Any

from epp.framework import BadRequest

_URL_PARTS = {"image_url": "image_url", "audio_url": "audio_url", "video_url": "video_url"}
_UNTYPED = ("image_url", "audio_url", "video_url", "input_audio")
FULL_CHECK_CHARS = 1 << 20
MAX_MEDIA_PARTS = 999  # vLLM's default limit per modality
_NOT_MEDIA = frozenset({"text", "input_text", "output_text", "refusal", "thinking", "tool_reference"})


def check_media_parts(messages: Sequence[Any], what: str = "messages") -> None:
    """Raise BadRequest naming the first malformed media part, or when there are more than vLLM's default
    `--limit-mm-per-prompt` (999) media parts: the EPP never loads more than a model server would."""
    media = 0
    for i, m in enumerate(messages):
        content = m.get("content") if isinstance(m, dict) else None
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            # text parts go by at dict-lookup speed (a body may hold 200k of them); the path is built on failure
            if type(part) is not dict:
                continue
            kind = part.get("type")
            if kind is not None and type(kind) is not str:  # e.g. an object: not a type any consumer can look up
                raise BadRequest(f"{what}[{i}].content[{j}].type must be a string")
            if kind not in _NOT_MEDIA or "uuid" in part:
                media += 1
                if media > MAX_MEDIA_PARTS:
                    raise BadRequest(f"at most {MAX_MEDIA_PARTS} media items may be provided in one prompt")
                try:
                    _check_part(part, "")
                except BadRequest as e:
                    raise BadRequest(f"{what}[{i}].content[{j}]{e.message}") from None


def _check_part(part: dict[str, Any], where: str) -> None:
    kind = part.get("type")
    uid = part.get("uuid")
    if kind is None:
        kind = next((k for k in _UNTYPED if k in part), None)
    if kind in _URL_PARTS:
        value = part.get(kind)
        if isinstance(value, dict):
            url = value.get("url")
        elif isinstance(value, str) and (part.get("type") is None or uid is not None):
            url = value
        elif value is None and uid is not None:
            return  # vLLM: the item is the one cached under this uuid
        else:
            raise BadRequest(f"{where}.{kind} must be an object with a url")
        if url is None and uid is not None:
            return
        _check_url(url, f"{where}.{kind}.url")
    elif kind == "input_image":
        url = part.get("image_url")
        if url is None and (uid is not None or part.get("file_id") is not None):
            return
        _check_url(url, f"{where}.image_url")
    elif kind == "input_audio":
        audio = part.get("input_audio")
        if not isinstance(audio, dict) or not isinstance(audio.get("data"), str):
            raise BadRequest(f"{where}.input_audio must be an object with base64 data and a format")
        if not isinstance(audio.get("format"), str):
            raise BadRequest(f"{where}.input_audio.format must be a string")
        _check_base64(audio["data"], f"{where}.input_audio.data")


def _check_url(url: Any, where: str) -> None:
    if not isinstance(url, str) or not url:
        raise BadRequest(f"{where} must be a non-empty string")
    head = url[:8].lower()
    if head.startswith("data:"):
        spec, sep, payload = url[5:].partition(",")
        if not sep:
            raise BadRequest(f"{where}: invalid data URL: missing ',' separator")
        _, sep, encoding = spec.rpartition(";")
        if not sep or encoding != "base64":
            raise BadRequest(f"{where}: only base64 data URLs are supported")
        _check_base64(payload, where)
    elif not head.startswith(("http://", "https://")):
        raise BadRequest(f"{where}: unsupported URL scheme (data:, http: or https: expected): {url[:40]!r}")


def _check_base64(payload: str, where: str) -> None:
    """Strict base64 (vLLM decodes with validate=True). Payloads up to FULL_CHECK_CHARS are decoded (~1 ms a MiB on
    the event loop); bigger ones get the shape checks only, and the tokenizer decodes them off the loop (a bad one
    is then not scored, and the model server answers its own 400)."""
    if not payload:
        raise BadRequest(f"{where}: empty base64 data")
    if len(payload) % 4:
        raise BadRequest(f"{where}: invalid base64 data (length not a multiple of 4)")
    if len(payload) > FULL_CHECK_CHARS:
        payload = payload[:4096] + payload[-4096:]
    try:
        binascii.a2b_base64(payload.encode("ascii"), strict_mode=True)
    except (binascii.Error, ValueError, UnicodeEncodeError):
        raise BadRequest(f"{where}: invalid base64 data") from None
