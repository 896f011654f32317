"""Go/pflag command-line syntax, so the flags a GIE or llm-d-router chart passes parse as the Go EPP parses them.

pflag (spf13/pflag, which both anchors use) accepts `--name=value`, `--name value` (not for booleans), a bare
`--bool` (true), `--bool=false`, one-letter shorthands (`-v 2`, `-v=2`, `-v2`) and `--` to end the flags. Go's own
`flag` package also takes a single dash before a long name (`-pool-name=x`); we accept that too. Values parse as Go
parses them: `strconv.ParseBool`, `strconv.ParseInt(s, 0, 64)`, `time.ParseDuration`, and pflag's comma lists.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any


class FlagError(ValueError):
    """A command-line problem: unknown flag, missing or malformed value."""


_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
_FALSE = {"0", "f", "F", "FALSE", "false", "False"}


def parse_bool(text: str) -> bool:
    """Go's strconv.ParseBool."""
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"invalid boolean {text!r} (want true or false)")


def parse_int(text: str) -> int:
    """Go's strconv.ParseInt(s, 0, 64): decimal, 0x/0o/0b prefixes, a leading 0 for octal, underscores."""
    s = text.strip()
    if s != text or not s:
        raise ValueError(f"invalid integer {text!r}")
    sign = 1
    body = s
    if body[0] in "+-":
        sign = -1 if body[0] == "-" else 1
        body = body[1:]
    try:
        if len(body) > 1 and body[0] == "0" and body[1].isdigit():
            value = int(body[1:].replace("_", ""), 8)
        else:
            value = int(body, 0)
    except ValueError:
        raise ValueError(f"invalid integer {text!r}") from None
    value *= sign
    if not -(2**63) <= value < 2**63:
        raise ValueError(f"integer {text!r} out of range")
    return value


_DURATION_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,  # U+03BC
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_DURATION_PART = re.compile(r"(\d*\.?\d*)(ns|us|µs|μs|ms|s|m|h)")


def parse_duration(text: str) -> float:
    """Go's time.ParseDuration, in seconds: `30s`, `1m30s`, `1.5h`, `300ms`, `-2s`; a bare `0` is allowed."""
    s = text
    sign = 1.0
    if s[:1] in ("+", "-"):
        sign = -1.0 if s[0] == "-" else 1.0
        s = s[1:]
    if s == "0":
        return 0.0
    if not s:
        raise ValueError(f"invalid duration {text!r}")
    total = 0.0
    pos = 0
    while pos < len(s):
        m = _DURATION_PART.match(s, pos)
        if m is None or m.group(1) in ("", "."):
            if re.fullmatch(r"\d+(\.\d*)?", s[pos:]):
                raise ValueError(f"missing unit in duration {text!r} (e.g. 30s, 1m30s, 500ms)")
            raise ValueError(f"invalid duration {text!r} (e.g. 30s, 1m30s, 500ms)")
        total += float(m.group(1)) * _DURATION_UNITS[m.group(2)]
        pos = m.end()
    return sign * total


_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1), "k": Decimal(10**3),
            "M": Decimal(10**6), "G": Decimal(10**9), "T": Decimal(10**12), "P": Decimal(10**15),
            "E": Decimal(10**18)}  # fmt: skip
_QUANTITY = re.compile(r"([+-]?(?:\d+\.?\d*|\.\d+))(Ki|Mi|Gi|Ti|Pi|Ei|[eE][+-]?\d+|[numkMGTPE])?")


def parse_quantity_bytes(text: str) -> int:
    """A byte count as llm-d-router's `--grpc-max-*-msg-size` reads it: a Kubernetes resource.Quantity after
    dropping one trailing B/b (`10MiB` = `10Mi` = 10485760, `25MB` = `25M` = 25000000). Fractions round up."""
    s = text.strip()
    if len(s) > 1 and s[-1] in "Bb":
        s = s[:-1]
    m = _QUANTITY.fullmatch(s)
    if m is None:
        raise ValueError(f"invalid quantity {text!r} (e.g. 10MiB, 25MB, 4194304)")
    number = Decimal(m.group(1))
    suffix = m.group(2) or ""
    try:
        if suffix in _BINARY:
            value = number * _BINARY[suffix]
        elif suffix[:1] in ("e", "E"):
            value = number * (Decimal(10) ** int(suffix[1:]))
        else:
            value = number * _DECIMAL[suffix]
    except InvalidOperation:
        raise ValueError(f"invalid quantity {text!r}") from None
    result = int(value.to_integral_value(rounding="ROUND_CEILING"))
    if result < 0:
        raise ValueError(f"must be non-negative, got {result}")
    if result >= 2**63:
        raise ValueError(f"{text!r} overflows the maximum supported size")
    return result


def parse_csv(text: str) -> list[str]:
    """pflag's StringSlice: one CSV record (quotes allowed); the empty string is an empty list."""
    if text == "":
        return []
    return next(csv.reader([text]))


@dataclass(frozen=True)
class Flag:
    name: str
    kind: str  # bool | int | string | duration | strings | ints | float
    help: str
    dest: str = ""
    shorthand: str = ""
    deprecated: str = ""  # printed when the flag is used (pflag's MarkDeprecated)
    hidden: bool = False

    @property
    def attr(self) -> str:
        return self.dest or self.name.replace("-", "_")


_SCALAR: dict[str, Callable[[str], Any]] = {
    "bool": parse_bool,
    "int": parse_int,
    "string": str,
    "duration": parse_duration,
    "float": float,
}


@dataclass
class Parsed:
    """What one parse produced: the values by attribute name, which flags were given, and warnings."""

    values: dict[str, Any]
    changed: set[str] = field(default_factory=set)
    warnings: list[str] = field(default_factory=list)


class FlagSet:
    def __init__(self, flags: Sequence[Flag], defaults: dict[str, Any]) -> None:
        self.flags = list(flags)
        self.by_name: dict[str, Flag] = {}
        self.by_short: dict[str, Flag] = {}
        for f in self.flags:
            if f.name in self.by_name:
                raise ValueError(f"flag --{f.name} defined twice")
            self.by_name[f.name] = f
            if f.shorthand:
                self.by_short[f.shorthand] = f
        self.defaults = defaults

    def parse(self, argv: Sequence[str]) -> Parsed:
        out = Parsed(values=dict(self.defaults))
        args = list(argv)
        i = 0
        while i < len(args):
            arg = args[i]
            i += 1
            if arg == "--":
                if i < len(args):
                    raise FlagError(f"unexpected argument {args[i]!r}: `epp serve` takes flags only")
                break
            if not arg.startswith("-") or arg == "-":
                hint = ""
                if i >= 2 and args[i - 2].startswith("-") and "=" not in args[i - 2]:
                    prev = self._lookup(args[i - 2])
                    if prev is not None and prev.kind == "bool":
                        hint = f" (a boolean takes its value after '=': --{prev.name}={arg})"
                raise FlagError(f"unexpected argument {arg!r}{hint}")
            body = arg[2:] if arg.startswith("--") else arg[1:]
            name, eq, value = body.partition("=")
            flag = self.by_name.get(name)
            if flag is None and not arg.startswith("--"):
                flag = self.by_short.get(name[:1])
                if flag is not None and not eq and len(name) > 1:
                    # -v2: the shorthand with its value attached
                    value, eq, name = name[1:], "=", name[:1]
                elif flag is not None and len(name) > 1:
                    flag = None
            if flag is None:
                raise FlagError(f"unknown flag: {arg.split('=', 1)[0]}")
            if not eq:
                if flag.kind == "bool":
                    value = "true"
                elif i < len(args):
                    value = args[i]
                    i += 1
                else:
                    raise FlagError(f"flag needs an argument: --{flag.name}")
            self._set(out, flag, value)
        return out

    def _lookup(self, arg: str) -> Flag | None:
        name = arg.lstrip("-")
        return self.by_name.get(name) or (self.by_short.get(name) if len(name) == 1 else None)

    def _set(self, out: Parsed, flag: Flag, value: str) -> None:
        try:
            if flag.kind in _SCALAR:
                parsed: Any = _SCALAR[flag.kind](value)
            elif flag.kind in ("strings", "ints"):
                items = parse_csv(value)
                if flag.kind == "ints":
                    items = [parse_int(x) for x in items]  # type: ignore[misc]
                # pflag slices: the first use replaces the default, later uses append.
                parsed = (list(out.values[flag.attr]) if flag.name in out.changed else []) + items
            else:  # pragma: no cover - a flag table bug
                raise AssertionError(flag.kind)
        except ValueError as e:
            raise FlagError(f'invalid argument "{value}" for "--{flag.name}" flag: {e}') from None
        out.values[flag.attr] = parsed
        out.changed.add(flag.name)
        if flag.deprecated:
            out.warnings.append(f"Flag --{flag.name} has been deprecated, {flag.deprecated}")

    def usage(self) -> str:
        lines = []
        for f in sorted(self.flags, key=lambda f: f.name):
            if f.hidden:
                continue
            short = f"-{f.shorthand}, " if f.shorthand else "    "
            kind = "" if f.kind == "bool" else f" {f.kind}"
            default = self.defaults.get(f.attr)
            shown = "" if _is_zero(default) else f" (default {_go_repr(default, f.kind)})"
            dep = f" (DEPRECATED: {f.deprecated})" if f.deprecated else ""
            lines.append(f"  {short}--{f.name}{kind}\n        {f.help}{shown}{dep}")
        return "\n".join(lines)


def go_duration(seconds: float) -> str:
    """Go's time.Duration.String(): `30s`, `1m0s`, `1h30m0s`, `1.5s`, `500ms`, `250µs`, `0s`."""
    ns = round(seconds * 1e9)
    sign = "-" if ns < 0 else ""
    ns = abs(ns)
    if ns == 0:
        return "0s"
    if ns < 1_000_000_000:
        for unit, size in (("ms", 1_000_000), ("µs", 1_000), ("ns", 1)):
            if ns >= size:
                return sign + _go_fraction(ns, size) + unit
    h, rest = divmod(ns, 3_600_000_000_000)
    m, rest = divmod(rest, 60_000_000_000)
    out = (f"{h}h" if h else "") + (f"{m}m" if h or m else "")
    return sign + out + _go_fraction(rest, 1_000_000_000) + "s"


def _go_fraction(value: int, size: int) -> str:
    whole, frac = divmod(value, size)
    digits = str(frac).rjust(len(str(size)) - 1, "0").rstrip("0") if frac else ""
    return f"{whole}.{digits}" if digits else str(whole)


def _go_float(value: float) -> str:
    """Go's %v of a float64 for the values flags take: `1` for 1.0, `0.1`."""
    return str(int(value)) if value.is_integer() and abs(value) < 1e21 else repr(value)


def _go_repr(value: Any, kind: str = "") -> str:
    """A default as pflag prints it (strings quoted, durations in Go syntax)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if kind == "duration" and isinstance(value, int | float):
        return go_duration(float(value))
    if isinstance(value, float):
        return _go_float(value)
    if isinstance(value, list):
        return "[" + ",".join(str(v) for v in value) + "]"
    if kind == "string" and isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return str(value)


def _is_zero(value: Any) -> bool:
    """pflag leaves out a default that is its type's zero value (false, 0, 0s, "", [])."""
    return (
        value is None
        or value is False
        or value == ""
        or value == []
        or (isinstance(value, int | float) and not isinstance(value, bool) and value == 0)
    )
