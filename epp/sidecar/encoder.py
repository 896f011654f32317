"""The E/P/D encoder stage (`--ec-connector`), as llm-d's sidecar runs it before prefill/decode.

When the EPP sent `x-encoder-hosts-ports` and the request is a chat completion with multimodal content parts
(`image_url`, `audio_url`, `video_url`, `input_audio`), every distinct item (URL items deduplicated) goes to an
encoder as its own chat request — the client's body with `messages` replaced by one user message holding only that
item, `max_tokens` 1 (`max_completion_tokens` 1 if the client set it), `stream` false — items spread round-robin
over the encoders, all in parallel. Any encoder failure fails the request (502), as llm-d's. Then:

- `ec-example` (shared storage): the encoders' answers are discarded; the encoders wrote the encoder cache where
  the prefill/decode engines read it.
- `ec-nixl`: each answer's `ec_transfer_params` object (keyed by multimodal hash) is merged into one map that the
  prefill and decode requests carry as `ec_transfer_params`; an answer without it is skipped (logged).

Either way the request continues with `cache_hit_threshold: 0` (the encoder ran: the prefill must run).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import aiohttp

from epp.framework.keys import REQUEST_ID_HEADER
from epp.sidecar.options import EC_NIXL

log = logging.getLogger(__name__)

MM_TYPES = frozenset({"image_url", "audio_url", "video_url", "input_audio"})
_URL_TYPES = ("image_url", "audio_url", "video_url")
CHAT_PATH = "/v1/chat/completions"


class EncoderFailed(Exception):
    pass


def mm_items(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The request's multimodal content parts, URL items deduplicated (inline items kept as they are)."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return []
    seen: set[str] = set()
    items: list[dict[str, Any]] = []
    for msg in messages:
        content = msg.get("content") if isinstance(msg, dict) else None
        if not isinstance(content, list):
            continue
        for part in content:
            if not isinstance(part, dict) or part.get("type") not in MM_TYPES:
                continue
            url = _url(part)
            if url:
                if url in seen:
                    continue
                seen.add(url)
            items.append(part)
    return items


def _url(part: dict[str, Any]) -> str:
    kind = part.get("type")
    if kind in _URL_TYPES:
        inner = part.get(kind)
        if isinstance(inner, dict) and isinstance(inner.get("url"), str):
            return str(inner["url"])
    return ""


def encoder_body(body: dict[str, Any], item: dict[str, Any]) -> dict[str, Any]:
    out = dict(body)
    out["messages"] = [{"role": "user", "content": [item]}]
    out["max_tokens"] = 1
    if "max_completion_tokens" in body:
        out["max_completion_tokens"] = 1
    out["stream"] = False
    out.pop("stream_options", None)
    return out


async def run_encoders(
    session: aiohttp.ClientSession,
    connector: str,
    scheme: str,
    hosts: list[str],
    body: dict[str, Any],
    rid: str,
    timeout: float,
) -> tuple[int, dict[str, Any] | None]:
    """Send every item of `body` to the encoders; (items encoded, merged ec_transfer_params or None).

    EncoderFailed on any failure (the sibling requests are cancelled)."""
    items = mm_items(body)
    if not items:
        log.debug("request %s: no multimodal items; encoder stage skipped", rid)
        return 0, None
    log.info("request %s: %d multimodal item(s) to encoders %s", rid, len(items), ",".join(hosts))
    client_timeout = aiohttp.ClientTimeout(total=timeout)

    async def one(idx: int, item: dict[str, Any]) -> dict[str, Any]:
        host = hosts[idx % len(hosts)]
        payload = json.dumps(encoder_body(body, item)).encode()
        headers = {"content-type": "application/json", REQUEST_ID_HEADER: f"{rid}-enc-{idx}"}
        try:
            async with session.post(
                f"{scheme}://{host}{CHAT_PATH}", data=payload, headers=headers, timeout=client_timeout
            ) as r:
                raw = await r.read()
                status = r.status
        except TimeoutError:
            raise EncoderFailed(f"encoder {host}: no answer within {timeout:g}s for item {idx}") from None
        except (aiohttp.ClientError, OSError) as e:
            raise EncoderFailed(f"encoder {host} unreachable for item {idx}: {e or type(e).__name__}") from None
        if status >= 400:
            raise EncoderFailed(f"encoder {host} answered HTTP {status} for item {idx}: {raw[:200]!r}")
        if connector != EC_NIXL:
            return {}
        try:
            answer = json.loads(raw)
        except ValueError:
            raise EncoderFailed(f"encoder {host}: the answer for item {idx} is not JSON") from None
        params = answer.get("ec_transfer_params") if isinstance(answer, dict) else None
        if not isinstance(params, dict) or not params:
            log.warning("request %s: encoder %s returned no ec_transfer_params for item %d", rid, host, idx)
            return {}
        return params

    tasks = [asyncio.ensure_future(one(i, item)) for i, item in enumerate(items)]
    try:
        answers = await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    if connector != EC_NIXL:
        return len(items), None
    merged: dict[str, Any] = {}
    for params in answers:
        merged.update(params)
    contributed = sum(1 for p in answers if p)
    if contributed == 0:
        log.warning("request %s: no encoder answer carried ec_transfer_params; continuing without them", rid)
        return len(items), None
    if contributed < len(items):
        log.warning("request %s: ec_transfer_params from %d of %d items", rid, contributed, len(items))
    return len(items), merged
