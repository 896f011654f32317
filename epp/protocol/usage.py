"""Token usage from model-server responses: a whole JSON body, or an SSE stream read chunk by chunk.

Streaming responses carry usage only when the client asked for `stream_options.include_usage=true`; the last
`data:` event with a non-null `usage` object wins (vLLM's continuous usage stats are cumulative). The Responses API
reports usage in its `response.completed` event.
"""

from __future__ import annotations

import json
from typing import Any

from epp.framework.types import Usage

# Non-streamed bodies bigger than this are not parsed for usage (embeddings can be huge; usage is best effort).
MAX_JSON_USAGE_BYTES = 16 * 1024 * 1024
# A token count outside [0, this] is not usage (a broken or hostile upstream): read as 0.
MAX_TOKENS = 1 << 40


def _int(d: dict[str, Any], *keys: str) -> int:
    for k in keys:
        v = d.get(k)
        if isinstance(v, int) and not isinstance(v, bool):
            return v if 0 <= v <= MAX_TOKENS else 0
    return 0


def usage_from_object(obj: Any) -> Usage | None:
    """Usage from a decoded response object (chat/text completion, Responses API, SSE event)."""
    if not isinstance(obj, dict):
        return None
    u = obj.get("usage")
    if not isinstance(u, dict) and obj.get("type") == "response.completed" and isinstance(obj.get("response"), dict):
        u = obj["response"].get("usage")
    if not isinstance(u, dict):
        return None
    prompt = _int(u, "prompt_tokens", "input_tokens")
    completion = _int(u, "completion_tokens", "output_tokens")
    cached = 0
    reported = False
    for details_key in ("prompt_tokens_details", "prompt_token_details", "input_tokens_details"):
        details = u.get(details_key)
        if isinstance(details, dict):
            cached = _int(details, "cached_tokens")
            reported = isinstance(details.get("cached_tokens"), int)
            break
    total = _int(u, "total_tokens") or prompt + completion
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=total,
        cached_tokens=cached,
        cached_tokens_reported=reported,
    )


def usage_from_json(body: bytes) -> Usage | None:
    if not body or len(body) > MAX_JSON_USAGE_BYTES:
        return None
    try:
        return usage_from_object(json.loads(body))
    except (ValueError, RecursionError):
        return None


class SSEUsageReader:
    """Feed SSE chunks as they pass; keeps only the unfinished last line, so memory stays O(line)."""

    __slots__ = ("_partial", "usage")

    def __init__(self) -> None:
        self._partial = b""
        self.usage: Usage | None = None

    def feed(self, chunk: bytes) -> None:
        if not chunk:
            return
        data = self._partial + chunk if self._partial else chunk
        end = data.rfind(b"\n")
        if end < 0:
            self._partial = data
            return
        self._partial = data[end + 1 :]
        if b'"usage"' not in data and b"response.completed" not in data:
            return
        for line in data[:end].split(b"\n"):
            self._line(line)

    def close(self) -> None:
        """End of stream: a last event without a trailing newline still counts."""
        if self._partial:
            self._line(self._partial)
            self._partial = b""

    def _line(self, line: bytes) -> None:
        line = line.rstrip(b"\r")
        if not line.startswith(b"data:"):
            return
        payload = line[5:].strip()
        if not payload or payload == b"[DONE]" or (b'"usage"' not in payload and b"response.completed" not in payload):
            return
        try:
            usage = usage_from_object(json.loads(payload))
        except (ValueError, RecursionError):
            return
        if usage is not None:
            self.usage = usage
