"""Rewrite the model name back in responses (`"model":"<target>"` → `"model":"<incoming>"`), chunk-safe.

GIE replaces both spellings (with and without a space after the colon) per chunk. We do the same, but also
hold back a chunk tail that could be the start of a split occurrence, so a name cut across two chunks is
still rewritten. At most len(pattern)-1 bytes are delayed, and only when the tail looks like a prefix.
"""

from __future__ import annotations

import json


class ModelNameRewriter:
    __slots__ = ("_carry", "_max", "_pairs")

    def __init__(self, target: str, incoming: str) -> None:
        t = _json_str(target)
        i = _json_str(incoming)
        self._pairs = ((b'"model":' + t, b'"model":' + i), (b'"model": ' + t, b'"model": ' + i))
        self._max = max(len(p) for p, _ in self._pairs)
        self._carry = b""

    def feed(self, chunk: bytes, end_of_stream: bool = False) -> bytes:
        """Rewritten bytes that can be sent now; at end of stream everything is flushed."""
        data = self._carry + chunk if self._carry else chunk
        self._carry = b""
        for old, new in self._pairs:
            if old in data:
                data = data.replace(old, new)
        if end_of_stream or not data:
            return data
        tail_start = max(0, len(data) - self._max + 1)
        q = data.find(b'"', tail_start)
        while q >= 0:
            suffix = data[q:]
            if any(old.startswith(suffix) for old, _ in self._pairs):
                self._carry = suffix
                return data[:q]
            q = data.find(b'"', q + 1)
        return data


def _json_str(s: str) -> bytes:
    try:
        return json.dumps(s, ensure_ascii=False).encode()
    except UnicodeEncodeError:  # a lone surrogate: the client sent it as an escape, so write it back as one
        return json.dumps(s, ensure_ascii=True).encode()
