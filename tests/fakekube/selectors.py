"""Kubernetes label and field selector parsing, as the apiserver accepts them (the forms clients send)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

Requirement = Callable[[Mapping[str, str]], bool]

_SET_RE = re.compile(r"^\s*(!?)([A-Za-z0-9./_-]+)\s+(in|notin)\s*\(([^)]*)\)\s*$")
_CMP_RE = re.compile(r"^\s*([A-Za-z0-9./_-]+)\s*(==|!=|=)\s*([A-Za-z0-9._-]*)\s*$")
_EXISTS_RE = re.compile(r"^\s*(!?)\s*([A-Za-z0-9./_-]+)\s*$")


class SelectorError(ValueError):
    pass


def _split(selector: str) -> list[str]:
    """Split on commas that are not inside `in (...)` parentheses."""
    parts: list[str] = []
    depth = 0
    cur: list[str] = []
    for ch in selector:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise SelectorError(f"unbalanced parentheses in {selector!r}")
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth:
        raise SelectorError(f"unbalanced parentheses in {selector!r}")
    parts.append("".join(cur))
    return [p for p in parts if p.strip()]


def _requirement(term: str) -> Requirement:
    m = _SET_RE.match(term)
    if m:
        if m.group(1):
            raise SelectorError(f"invalid selector term {term!r}")
        key, op = m.group(2), m.group(3)
        values = {v.strip() for v in m.group(4).split(",") if v.strip()}
        if op == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    m = _CMP_RE.match(term)
    if m:
        key, op, value = m.groups()
        if op == "!=":
            return lambda labels: labels.get(key) != value
        return lambda labels: labels.get(key) == value
    m = _EXISTS_RE.match(term)
    if m:
        neg, key = m.groups()
        if neg:
            return lambda labels: key not in labels
        return lambda labels: key in labels
    raise SelectorError(f"invalid selector term {term!r}")


def label_selector(selector: str | None) -> Requirement:
    """A predicate over a labels mapping; all terms must hold (an empty selector matches everything)."""
    if not selector:
        return lambda labels: True
    reqs = [_requirement(t) for t in _split(selector)]
    return lambda labels: all(r(labels) for r in reqs)


_FIELDS: dict[str, Callable[[dict[str, Any]], str]] = {
    "metadata.name": lambda o: str(o.get("metadata", {}).get("name", "")),
    "metadata.namespace": lambda o: str(o.get("metadata", {}).get("namespace", "")),
    "status.phase": lambda o: str(o.get("status", {}).get("phase", "")),
    "spec.nodeName": lambda o: str(o.get("spec", {}).get("nodeName", "")),
}


def _compare(get: Callable[[dict[str, Any]], Any], value: str, negate: bool) -> Callable[[dict[str, Any]], bool]:
    if negate:
        return lambda o: bool(get(o) != value)
    return lambda o: bool(get(o) == value)


def field_selector(selector: str | None) -> Callable[[dict[str, Any]], bool]:
    """Field selectors support only `=`, `==` and `!=` on a fixed set of fields (like the apiserver)."""
    if not selector:
        return lambda obj: True
    checks: list[Callable[[dict[str, Any]], bool]] = []
    for term in _split(selector):
        m = _CMP_RE.match(term)
        if not m or m.group(1) not in _FIELDS:
            raise SelectorError(f"field label not supported: {term!r}")
        get = _FIELDS[m.group(1)]
        op, value = m.group(2), m.group(3)
        checks.append(_compare(get, value, negate=op == "!="))
    return lambda obj: all(c(obj) for c in checks)
