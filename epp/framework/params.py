"""Plugin parameters: typed getters over the raw `parameters` mapping, with errors that name the key."""

from __future__ import annotations

import builtins
import re
from collections.abc import Mapping
from typing import Any


class PluginConfigError(ValueError):
    """A bad plugin parameter. `key` is the parameter name (the config loader adds the line)."""

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


_DURATION_RE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(value: Any) -> float:
    """A Go duration string ("200ms", "1m30s") or a number of seconds → seconds."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration like '200ms', got {value!r}")
    if isinstance(value, int | float):
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
    """Typed access to one plugin's parameters; every error says plugin, key, expectation and the bad value."""

    def __init__(self, plugin: builtins.str, raw: Mapping[builtins.str, Any] | None) -> None:
        if raw is not None and not isinstance(raw, Mapping):
            raise PluginConfigError(f"{plugin}: parameters must be a mapping, got {type(raw).__name__}")
        self.plugin = plugin
        self.raw: Mapping[builtins.str, Any] = raw or {}

    def _fail(self, key: builtins.str, what: builtins.str) -> PluginConfigError:
        return PluginConfigError(f"{self.plugin}: parameter {key!r}: {what}, got {self.raw.get(key)!r}", key=key)

    def has(self, key: builtins.str) -> builtins.bool:
        return key in self.raw and self.raw[key] is not None

    def get(self, key: builtins.str, default: Any = None) -> Any:
        v = self.raw.get(key)
        return default if v is None else v

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
            raise self._fail(key, "expected an integer")
        v = int(v)
        if min is not None and v < min:
            raise self._fail(key, f"must be >= {min}")
        if max is not None and v > max:
            raise self._fail(key, f"must be <= {max}")
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
            raise self._fail(key, "expected a number")
        v = float(v)
        if min is not None and (v < min or (min_exclusive and v == min)):
            raise self._fail(key, f"must be {'>' if min_exclusive else '>='} {min}")
        if max is not None and v > max:
            raise self._fail(key, f"must be <= {max}")
        return v

    def str(
        self, key: builtins.str, default: builtins.str, *, choices: tuple[builtins.str, ...] | None = None
    ) -> builtins.str:
        v = self.get(key, default)
        if not isinstance(v, str):
            raise self._fail(key, "expected a string")
        if choices is not None and v not in choices:
            raise self._fail(key, f"must be one of {', '.join(choices)}")
        return v

    def bool(self, key: builtins.str, default: builtins.bool) -> builtins.bool:
        v = self.get(key, default)
        if not isinstance(v, bool):
            raise self._fail(key, "expected true or false")
        return v

    def duration(self, key: builtins.str, default: builtins.float) -> builtins.float:
        """Seconds, from a Go duration string ("200ms") or a number of seconds."""
        v = self.get(key, None)
        if v is None:
            return default
        try:
            return parse_duration(v)
        except ValueError as e:
            raise self._fail(key, str(e).split(", got")[0]) from None

    def mapping(self, key: builtins.str) -> Mapping[builtins.str, Any]:
        v = self.get(key, {})
        if not isinstance(v, Mapping):
            raise self._fail(key, "expected a mapping")
        return v

    def list(self, key: builtins.str) -> builtins.list[Any]:
        v = self.get(key, [])
        if not isinstance(v, list):
            raise self._fail(key, "expected a list")
        return v
