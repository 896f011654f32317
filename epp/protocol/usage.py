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


# Candidate usage lines held unparsed before they are resolved (bytes): bounds the reader's memory.
_MAX_PENDING_BYTES = 64 * 1024
_MAX_PENDING_LINES = 32


class SSEUsageReader:
    """Feed SSE chunks as they pass; keeps only the unfinished last line, so memory stays O(line).

    Per chunk it only finds lines that can carry usage (a C substring scan); parsing is deferred: the candidate lines
    are held (bounded) and parsed newest first when `usage` is read, so a stream that reports usage in every chunk
    (vLLM's continuous usage stats, or `"usage":null` on every chunk with include_usage) costs one JSON parse per
    stream instead of one per chunk. The result is the same as parsing every line in order: the last line that
    yields usage wins."""

    __slots__ = ("_partial", "_pending", "_pending_bytes", "_usage")

    def __init__(self) -> None:
        self._partial = b""
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._usage: Usage | None = None

    @property
    def usage(self) -> Usage | None:
        if self._pending:
            self._resolve()
        return self._usage

    def feed(self, chunk: bytes) -> None:
        if not chunk:
            return
        data = self._partial + chunk if self._partial else chunk
        end = data.rfind(b"\n")
        if end < 0:
            self._partial = data
            return
        self._partial = data[end + 1 :]
        if b"response.completed" not in data:
            n = data.count(b'"usage"')
            # No usage key, or only include_usage's `"usage":null` (every chunk but the last): nothing to hold.
            if not n or n == data.count(b'"usage":null') + data.count(b'"usage": null'):
                return
        for line in data[:end].split(b"\n"):
            self._candidate(line)

    def close(self) -> None:
        """End of stream: a last event without a trailing newline still counts."""
        if self._partial:
            self._candidate(self._partial)
            self._partial = b""
        if self._pending:
            self._resolve()

    def _candidate(self, line: bytes) -> None:
        if not line.startswith(b"data:"):
            return
        payload = line[5:].strip()
        if not payload or payload == b"[DONE]":
            return
        completed = b"response.completed" in payload
        n = payload.count(b'"usage"')
        if not n and not completed:
            return
        if n == 1 and not completed and (b'"usage":null' in payload or b'"usage": null' in payload):
            return  # include_usage puts a null usage in every chunk but the last
        self._pending.append(payload)
        self._pending_bytes += len(payload)
        if len(self._pending) >= _MAX_PENDING_LINES or self._pending_bytes > _MAX_PENDING_BYTES:
            self._resolve()

    def _resolve(self) -> None:
        """Parse the held lines newest first; the first that yields usage is the latest usage."""
        pending, self._pending, self._pending_bytes = self._pending, [], 0
        for payload in reversed(pending):
            try:
                usage = usage_from_object(json.loads(payload))
            except (ValueError, RecursionError):
                continue
            if usage is not None:
                self._usage = usage
                return
