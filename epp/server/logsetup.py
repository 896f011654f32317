"""Logging from the anchors' logging flags: `-v`, `--zap-devel`, `--zap-encoder`, `--zap-log-level`,
`--zap-stacktrace-level`, `--zap-time-encoding` (controller-runtime's zap options), and pyepp's `--log-level`.

Verbosity is the anchors' (`epp.framework.verbosity`): `-v=n` shows the lines logged at V(0)..V(n), so every
step of `-v` counts (V(2) the default, V(3) verbose, V(4) debug, V(5) trace); `--zap-log-level` overrides it
as controller-runtime reads it (`debug` is zap's level -1, i.e. V(1); an integer n is V(n)); `--log-level`
overrides both.

Without zap flags a line is what llm-d-router v0.10 and GIE v1.5 write (`logging.InitSetupLogging`): zap's
production JSON (epoch `ts`), a stack trace only from ERROR up, and zap's sampler (per second and message, the
first 100 lines, then every 100th). Their `InitLogging` applies only the level, so there `--zap-devel` (default
true), `--zap-encoder`, `--zap-stacktrace-level` and `--zap-time-encoding` change nothing; here a zap flag given
on the command line takes effect as controller-runtime documents it (`--zap-devel`: console lines, stack traces
from WARN, no sampling), and the defaults are the anchors' output. A WARN with an exception carries its one-line
`error`, not a traceback, unless stack traces were asked for at that level.
"""

from __future__ import annotations

import datetime
import json
import logging
import sys
import time
import traceback
from typing import Any

from epp.framework.verbosity import DEBUG, TRACE, V
from epp.server.options import Options

DEBUG_VERBOSITY = DEBUG
_ZAP_TO_PY = {"debug": V(1), "info": logging.INFO, "error": logging.ERROR, "panic": logging.CRITICAL}
_PY_LEVEL_NAMES = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
# zap's sampler in the anchors' production logger (controller-runtime zap.Options.addDefaults): per tick and
# (level, message), the first SAMPLE_FIRST lines pass, then every SAMPLE_THEREAFTER-th.
SAMPLE_TICK = 1.0
SAMPLE_FIRST = 100
SAMPLE_THEREAFTER = 100


def python_level(opts: Options) -> int:
    if opts.log_level:
        return _PY_LEVEL_NAMES[opts.log_level]
    if opts.zap_log_level:
        if opts.zap_log_level in _ZAP_TO_PY:
            return _ZAP_TO_PY[opts.zap_log_level]
        return V(int(opts.zap_log_level))
    return V(opts.v)


def _zap_level(levelno: int) -> str:
    """The anchors' level names (their LevelEncoder): V(1)-V(3) are "info", V(4) "debug", V(5) and up "trace"."""
    if levelno >= logging.CRITICAL:
        return "panic"
    if levelno >= logging.ERROR:
        return "error"
    if levelno >= logging.WARNING:
        return "warn"
    if levelno >= V(3):
        return "info"
    if levelno > V(TRACE):
        return "debug"
    return "trace"


class ZapFormatter(logging.Formatter):
    """zap's JSON or console line: level, ts, logger, caller, msg; an exception's one-line `error`, and a
    `stacktrace` (the exception's traceback, or the call stack) from the stacktrace level up."""

    def __init__(self, encoder: str, time_encoding: str, stacktrace_level: int) -> None:
        super().__init__()
        self.encoder = encoder
        self.time_encoding = time_encoding
        self.stacktrace_level = stacktrace_level

    def _ts(self, created: float) -> Any:
        enc = self.time_encoding
        if enc == "epoch":
            return created
        if enc == "millis":
            return created * 1000.0
        if enc == "nano":
            return int(created * 1e9)
        t = datetime.datetime.fromtimestamp(created, datetime.UTC).astimezone()
        if enc == "rfc3339":
            return t.isoformat(timespec="seconds")
        if enc == "rfc3339nano":
            return t.isoformat(timespec="microseconds")
        return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}" + t.strftime("%z")  # iso8601

    def format(self, record: logging.LogRecord) -> str:
        msg = record.getMessage()
        caller = f"{record.filename}:{record.lineno}"
        stack = error = ""
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None:
            error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        if record.levelno >= self.stacktrace_level:
            if record.exc_info:
                stack = self.formatException(record.exc_info)
            else:
                stack = "".join(traceback.format_stack()[:-8]).rstrip()
        if self.encoder == "json":
            out: dict[str, Any] = {
                "level": _zap_level(record.levelno),
                "ts": self._ts(record.created),
                "logger": record.name,
                "caller": caller,
                "msg": msg,
            }
            if error:
                out["error"] = error
            if stack:
                out["stacktrace"] = stack
            return json.dumps(out, default=str)
        ts = self._ts(record.created)
        line = f"{ts}\t{_zap_level(record.levelno).upper()}\t{record.name}\t{caller}\t{msg}"
        if error:
            line += f'\t{{"error": {json.dumps(error)}}}'
        return f"{line}\n{stack}" if stack else line


class ZapSampler(logging.Filter):
    """zap's sampler (`zapcore.NewSamplerWithOptions(core, tick, first, thereafter)`): per tick and (level,
    message template), the first `first` records pass, then every `thereafter`-th. Like zap's, it samples levels
    from V(1) up (zap's Debug) and lets more verbose lines through; keys are bounded as zap's counters are."""

    MAX_KEYS = 4096

    def __init__(
        self, tick: float = SAMPLE_TICK, first: int = SAMPLE_FIRST, thereafter: int = SAMPLE_THEREAFTER
    ) -> None:
        super().__init__()
        self.tick = tick
        self.first = first
        self.thereafter = thereafter
        self._counts: dict[tuple[int, str], list[float]] = {}  # key -> [window start, count]

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < V(1):
            return True
        key = (record.levelno, str(record.msg))
        now = time.monotonic()
        c = self._counts.get(key)
        if c is None or now - c[0] >= self.tick:
            if c is None and len(self._counts) >= self.MAX_KEYS:
                self._counts.clear()
            self._counts[key] = [now, 1]
            return True
        c[1] += 1
        n = int(c[1])
        return n <= self.first or (self.thereafter > 0 and (n - self.first) % self.thereafter == 0)


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is at the time (a test's capture may replace and close it)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


_STACK_LEVELS = {"info": logging.INFO, "error": logging.ERROR, "panic": logging.CRITICAL}


def log_format(opts: Options) -> tuple[str, str, int, bool]:
    """(encoder, time encoding, stacktrace level, sampled): the anchors' output, changed by the zap flags given."""
    devel = opts.given("zap-devel") and opts.zap_devel
    encoder = opts.zap_encoder or ("console" if devel else "json")
    time_encoding = opts.zap_time_encoding or "epoch"
    if opts.zap_stacktrace_level:
        stack_level = _STACK_LEVELS[opts.zap_stacktrace_level]
    else:
        stack_level = logging.WARNING if devel else logging.ERROR
    return encoder, time_encoding, stack_level, not devel


def setup_logging(opts: Options) -> None:
    encoder, time_encoding, stack_level, sampled = log_format(opts)
    handler = _StderrHandler()
    handler.setFormatter(ZapFormatter(encoder, time_encoding, stack_level))
    if sampled:
        handler.addFilter(ZapSampler())
    root = logging.getLogger()
    for h in list(root.handlers):
        if isinstance(h, _StderrHandler):
            root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(python_level(opts))
