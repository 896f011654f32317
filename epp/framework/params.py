"""Plugin parameters: typed getters over the raw `parameters` mapping, with errors that name the key."""

from __future__ import annotations

import builtins
import math
import re
from collections.abc import Mapping
from typing import Any


class PluginConfigError(ValueError):
    """A bad plugin parameter. `key` is the parameter's dotted path; `line` its line in the file when known
    (else the config builder looks the top-level key up)."""

    def __init__(self, message: str, *, key: str | None = None, line: int = 0) -> None:
        super().__init__(message)
        self.key = key
        self.line = line


def _line_of(container: object, key: str) -> int:
    """The line of `key` in a line-marked mapping from the config loader (duck-typed: no config import here)."""
    line_of = getattr(container, "line_of", None)
    if line_of is None:
        return 0
    line = line_of(key)
    return line if isinstance(line, int) else 0


INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1

_DURATION_RE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(value: Any) -> float:
    """A Go duration string ("200ms", "1m30s") or a number of seconds → seconds."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration like '200ms', got {value!r}")
    if isinstance(value, int | float):
        if not math.isfinite(value):
            raise ValueError(f"duration must be a finite number, got {value!r}")
        if value < 0:
            raise ValueError(f"duration must not be negative, got {value!r}")
        return float(value)
    if not isinstance(value, str) or not value:
        raise ValueError(f"expected a duration like '200ms', got {value!r}")
    s = value.strip()
    if s == "0":
        return 0.0
    pos, total = 0, 0.0
    for m in _DURATION_RE.finditer(s):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _DURATION_UNITS[m.group(2)]
        pos = m.end()
    if pos != len(s) or pos == 0:
        raise ValueError(f"expected a duration like '200ms' or '2s', got {value!r}")
    return total


class Params:
    """Typed access to one plugin's parameters; every error says plugin, key, expectation and the bad value.

    `section(key)` gives the same access to a nested mapping, with errors naming the dotted path and its line.
    Keys read are remembered (`unread()` lists the others).
    """

    def __init__(
        self, plugin: builtins.str, raw: Mapping[builtins.str, Any] | None, *, path: builtins.str = ""
    ) -> None:
        if raw is not None and not isinstance(raw, Mapping):
            where = f"parameter {path!r}" if path else "parameters"
            raise PluginConfigError(f"{plugin}: {where} must be a mapping, got {type(raw).__name__}", key=path or None)
        self.plugin = plugin
        self.raw: Mapping[builtins.str, Any] = raw if raw is not None else {}
        self.path = path
        self._read: builtins.set[builtins.str] = builtins.set()
        self._sections: builtins.list[Params] = []

    def _path(self, key: builtins.str) -> builtins.str:
        return f"{self.path}.{key}" if self.path else key

    def fail(self, key: builtins.str, what: builtins.str) -> PluginConfigError:
        """An error for `key`: `<plugin>: parameter '<path>': <what>, got <value>`."""
        path = self._path(key)
        return PluginConfigError(
            f"{self.plugin}: parameter {path!r}: {what}, got {self.raw.get(key)!r}",
            key=path,
            line=_line_of(self.raw, key),
        )

    def has(self, key: builtins.str) -> builtins.bool:
        return key in self.raw and self.raw[key] is not None

    def get(self, key: builtins.str, default: Any = None) -> Any:
        self._read.add(key)
        v = self.raw.get(key)
        return default if v is None else v

    def unread(self) -> builtins.list[builtins.str]:
        """Keys present but never read, as dotted paths, nested sections included (unknown parameters)."""
        out = [self._path(k) for k in self.raw if k not in self._read]
        for sec in self._sections:
            out.extend(sec.unread())
        return out

    def unread_error(self) -> PluginConfigError | None:
        """An error naming the first unknown parameter (and its line), or None when every key was read."""
        for k in self.raw:
            if k not in self._read:
                return PluginConfigError(
                    f"{self.plugin}: unknown parameter {self._path(k)!r}", key=self._path(k), line=_line_of(self.raw, k)
                )
        for sec in self._sections:
            err = sec.unread_error()
            if err is not None:
                return err
        return None

    def ignore(self, *keys: builtins.str) -> None:
        """Mark keys as read: accepted for compatibility and deliberately without effect."""
        self._read.update(keys)

    def section(self, key: builtins.str) -> Params:
        """The nested mapping under `key` (empty if absent); asked twice, the same one (keys read by either count)."""
        path = self._path(key)
        for sec in self._sections:
            if sec.path == path:
                return sec
        v = self.get(key, None)
        if v is not None and not isinstance(v, Mapping):
            raise self.fail(key, "expected a mapping")
        sec = Params(self.plugin, v, path=path)
        self._sections.append(sec)
        return sec

    def int(
        self,
        key: builtins.str,
        default: builtins.int,
        *,
        min: builtins.int | None = None,
        max: builtins.int | None = None,
    ) -> builtins.int:
        v = self.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int | float) or (isinstance(v, float) and not v.is_integer()):
            raise self.fail(key, "expected an integer")
        v = int(v)
        if not INT64_MIN <= v <= INT64_MAX:  # the anchors decode into Go's int: past it is a decode error there
            raise self.fail(key, "out of range (a 64-bit integer)")
        if min is not None and v < min:
            raise self.fail(key, f"must be >= {min}")
        if max is not None and v > max:
            raise self.fail(key, f"must be <= {max}")
        return v

    def float(
        self,
        key: builtins.str,
        default: builtins.float,
        *,
        min: builtins.float | None = None,
        max: builtins.float | None = None,
        min_exclusive: builtins.bool = False,
    ) -> builtins.float:
        v = self.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise self.fail(key, "expected a number")
        try:
            v = float(v)
        except OverflowError:
            raise self.fail(key, "out of range") from None
        if not math.isfinite(v):
            raise self.fail(key, "expected a finite number")
        if min is not None and (v < min or (min_exclusive and v == min)):
            raise self.fail(key, f"must be {'>' if min_exclusive else '>='} {min}")
        if max is not None and v > max:
            raise self.fail(key, f"must be <= {max}")
        return v

    def str(
        self, key: builtins.str, default: builtins.str, *, choices: tuple[builtins.str, ...] | None = None
    ) -> builtins.str:
        v = self.get(key, default)
        if not isinstance(v, str):
            raise self.fail(key, "expected a string")
        if choices is not None and v not in choices:
            raise self.fail(key, f"must be one of {', '.join(choices)}")
        return v

    def bool(self, key: builtins.str, default: builtins.bool) -> builtins.bool:
        v = self.get(key, default)
        if not isinstance(v, bool):
            raise self.fail(key, "expected true or false")
        return v

    def duration(self, key: builtins.str, default: builtins.float) -> builtins.float:
        """Seconds, from a Go duration string ("200ms") or a number of seconds."""
        v = self.get(key, None)
        if v is None:
            return default
        try:
            return parse_duration(v)
        except ValueError as e:
            raise self.fail(key, str(e).split(", got")[0]) from None

    def optional_str(self, key: builtins.str) -> builtins.str | None:
        v = self.get(key, None)
        if v is not None and not isinstance(v, str):
            raise self.fail(key, "expected a string")
        return v

    def mapping(self, key: builtins.str) -> Mapping[builtins.str, Any]:
        v = self.get(key, {})
        if not isinstance(v, Mapping):
            raise self.fail(key, "expected a mapping")
        return v

    def list(self, key: builtins.str) -> builtins.list[Any]:
        v = self.get(key, [])
        if not isinstance(v, list):
            raise self.fail(key, "expected a list")
        return v
