"""Decode a large JSON body in bounded pieces, so that a worker thread decoding it lets the event loop run.

One `msgspec` call on a 100 MiB body holds the GIL for all of it (~0.1 s of CPU, several times that in wall
time on a busy box), so a worker thread making that one call stalls the event loop just the same. A large body
is nearly always large because of a few huge strings (a long prompt, a pasted document): those are found with
bounded `find` calls, cut out of the body, decoded ~1 MiB at a time (msgspec still judges every byte: escapes,
control characters, UTF-8) and put back into the structure that msgspec decodes from what is left. Between two
bounded C calls the interpreter hands the GIL to the event loop (every `sys.getswitchinterval()`, 5 ms).

The cost: a huge string exists twice for a moment (its pieces and their join). Anything unusual (a huge string
used as a key or as the whole body, long runs of backslashes, a piece msgspec refuses) gives None: the caller
decodes the body in one piece as before, so errors and edge cases are judged exactly as before.
"""

from __future__ import annotations

import os
from typing import Any

import msgspec

# Strings at least this long are decoded on their own.
BIG_STRING = 256 * 1024
_WINDOW = 1 << 20  # bytes per bounded scan or decoded piece
# Quotes looked at (string delimiters and escaped quotes) before giving up: each costs ~1-2 us of Python, and a
# body of a million small strings has nothing this module could decode better anyway.
_MAX_QUOTES = 1_000_000
_decode = msgspec.json.Decoder().decode


def _closing_quote(body: bytes, start: int, budget: list[int]) -> int:
    """The index of the quote closing the string whose content starts at `start`; -1 when it is unterminated or
    too odd to scan cheaply (a long run of backslashes, the quote budget spent)."""
    find = body.find
    n = len(body)
    e = start
    while budget[0] > 0:
        budget[0] -= 1
        q = find(b'"', e, min(n, e + _WINDOW))
        while q < 0:
            e += _WINDOW
            if e >= n:
                return -1
            q = find(b'"', e, min(n, e + _WINDOW))
        before = body[max(start, q - 64) : q]
        run = len(before) - len(before.rstrip(b"\\"))  # backslashes right before the quote
        if run == 64:
            return -1
        if run % 2 == 0:
            return q
        e = q + 1
    return -1


def _big_strings(body: bytes) -> list[tuple[int, int]] | None:
    """(start, end) of the content of every string of at least BIG_STRING bytes, in order; None if unscannable.
    Outside strings JSON has no quotes, so the quotes alone delimit the strings."""
    spans: list[tuple[int, int]] = []
    budget = [_MAX_QUOTES]
    pos = 0
    find = body.find
    n = len(body)
    while True:
        q = find(b'"', pos, min(n, pos + _WINDOW))
        if q < 0:
            pos += _WINDOW
            if pos >= n:
                return spans
            continue
        e = _closing_quote(body, q + 1, budget)
        if e < 0:
            return None
        if e - q - 1 >= BIG_STRING:
            spans.append((q + 1, e))
        pos = e + 1


def _split_point(body: bytes, p: int, end: int) -> int:
    """A position at or after `p` where a string's content can be cut: no backslash in the 6 bytes before it (so
    not inside an escape, nor between the halves of a surrogate pair), not inside a UTF-8 sequence. -1 if none
    is found quickly (a stretch dense with escapes)."""
    i = p
    for _ in range(64):
        if i >= end:
            return end
        k = body.rfind(b"\\", i - 6, i)
        if k >= 0:
            i = k + 7
        elif body[i] & 0xC0 == 0x80:
            i += 1
        else:
            return i
    return -1


def _string(body: bytes, start: int, end: int) -> str | None:
    parts: list[str] = []
    i = start
    while i < end:
        j = _split_point(body, min(end, i + _WINDOW), end)
        if j < 0:
            return None
        try:
            part = _decode(b'"' + body[i:j] + b'"')
        except msgspec.DecodeError:
            return None
        if not isinstance(part, str):
            return None
        parts.append(part)
        i = j
    return "".join(parts)


def decode_big(body: bytes) -> Any | None:
    """The decoded body, or None when it should be decoded in one piece (see the module's docstring)."""
    spans = _big_strings(body)
    if not spans:
        return None
    tag = "\x00pyepp-" + os.urandom(8).hex() + "-"  # a placeholder no client can guess
    skeleton: list[bytes] = []
    prev = 0
    for k, (s, e) in enumerate(spans):
        skeleton.append(body[prev:s])
        skeleton.append(f"{tag}{k}".encode().replace(b"\x00", b"\\u0000"))
        prev = e
    skeleton.append(body[prev:])
    try:
        root = _decode(b"".join(skeleton))
    except msgspec.DecodeError:
        return None
    del skeleton
    found = 0
    level: list[Any] = [root]
    while level:
        deeper: list[Any] = []
        for node in level:
            items = node.items() if type(node) is dict else enumerate(node)
            for key, v in items:
                if type(key) is str and key.startswith(tag):
                    return None
                if type(v) is str and v.startswith(tag):
                    s, e = spans[int(v[len(tag) :])]
                    text = _string(body, s, e)
                    if text is None:
                        return None
                    node[key] = text
                    found += 1
                elif type(v) is dict or type(v) is list:
                    deeper.append(v)
        level = deeper
    if found != len(spans) or (type(root) is not dict and type(root) is not list):
        return None
    return root
