"""A fast, partial Prometheus text-format reader: finds only the families asked for.

A vLLM /metrics page is ~100 KB, mostly histograms we never read. Instead of parsing every line, each wanted
family is located with str.find (C speed) and only its sample lines are parsed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_LABEL_RE = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')

Sample = tuple[dict[str, str], float]


def _unescape(v: str) -> str:
    if "\\" not in v:
        return v
    return v.replace("\\n", "\n").replace('\\"', '"').replace("\\\\", "\\")


def parse_labels(s: str) -> dict[str, str]:
    """`a="x",b="y"` (without braces) → dict."""
    out = {}
    pos = 0
    while pos < len(s):
        m = _LABEL_RE.match(s, pos)
        if m is None:
            break
        out[m.group(1)] = _unescape(m.group(2))
        pos = m.end()
    return out


def _sample(text: str, start: int) -> tuple[Sample | None, int]:
    """Parse `{labels} value [ts]` or ` value [ts]` starting at `start` (just after the metric name)."""
    end = text.find("\n", start)
    if end < 0:
        end = len(text)
    labels: dict[str, str] = {}
    pos = start
    if text.startswith("{", pos):
        close = text.find("}", pos)
        # a '}' inside a quoted label value: fall back to scanning quote-aware
        if close < 0 or text.count('"', pos, close) % 2 or text.find("\\", pos, close) >= 0:
            close = _quoted_close(text, pos + 1, end)
        if close < 0:
            return None, end
        labels = parse_labels(text[pos + 1 : close])
        pos = close + 1
    fields = text[pos:end].split()
    if not fields:
        return None, end
    try:
        value = float(fields[0])
    except ValueError:
        return None, end
    return (labels, value), end


def _quoted_close(text: str, pos: int, end: int) -> int:
    quoted = False
    while pos < end:
        c = text[pos]
        if c == "\\" and quoted:
            pos += 2
            continue
        if c == '"':
            quoted = not quoted
        elif c == "}" and not quoted:
            return pos
        pos += 1
    return -1


def find_family(text: str, name: str) -> list[Sample]:
    """All samples of metric `name` (exact name: `foo` does not match `foo_total`)."""
    out: list[Sample] = []
    n = len(name)
    if text.startswith(name):
        pos = 0
    else:
        first = text.find("\n" + name)
        pos = first + 1 if first >= 0 else -1
    in_group = False
    while pos >= 0:
        after = pos + n
        c = text[after : after + 1]
        if c in ("{", " ", "\t"):
            sample, end = _sample(text, after)
            if sample is not None:
                out.append(sample)
            in_group = True
            pos = end
        elif in_group:
            # The text format puts all of a family's samples in one group of lines: once a line after them is not
            # one of them, the family is over (not scanning the rest of a ~100 KB page for more is most of the cut).
            return out
        else:
            pos = after
        if in_group:
            if text.startswith(name, pos + 1):
                pos += 1
                continue
            return out
        nxt = text.find("\n" + name, pos)
        pos = nxt + 1 if nxt >= 0 else -1
    return out


def find_families(text: str, names: Iterable[str]) -> dict[str, list[Sample]]:
    return {name: find_family(text, name) for name in names}
