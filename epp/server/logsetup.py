"""Logging from the anchors' logging flags: `-v`, `--zap-devel`, `--zap-encoder`, `--zap-log-level`,
`--zap-stacktrace-level`, `--zap-time-encoding` (controller-runtime's zap options), and pyepp's `--log-level`.

Verbosity follows the anchors' logr levels: V(2) is the default, V(4) DEBUG, V(5) TRACE. Python's DEBUG records are
what the anchors log at V(4) and above, so `-v` below 4 logs INFO and up, `-v=4` or more adds DEBUG.
`--zap-log-level` overrides `-v` (debug, info, error, panic, or an integer read as `-v`); `--log-level` overrides both.
"""

from __future__ import annotations

import datetime
import json
import logging
import sys
import traceback
from typing import Any

from epp.server.options import Options

DEBUG_VERBOSITY = 4
_ZAP_TO_PY = {"debug": logging.DEBUG, "info": logging.INFO, "error": logging.ERROR, "panic": logging.CRITICAL}
_PY_LEVEL_NAMES = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def python_level(opts: Options) -> int:
    if opts.log_level:
        return _PY_LEVEL_NAMES[opts.log_level]
    if opts.zap_log_level:
        if opts.zap_log_level in _ZAP_TO_PY:
            return _ZAP_TO_PY[opts.zap_log_level]
        return logging.DEBUG if int(opts.zap_log_level) >= DEBUG_VERBOSITY else logging.INFO
    return logging.DEBUG if opts.v >= DEBUG_VERBOSITY else logging.INFO


def _zap_level(levelno: int) -> str:
    if levelno >= logging.CRITICAL:
        return "panic"
    if levelno >= logging.ERROR:
        return "error"
    if levelno >= logging.WARNING:
        return "warn"
    if levelno >= logging.INFO:
        return "info"
    return "debug"


class ZapFormatter(logging.Formatter):
    """zap's JSON or console line: level, ts, logger, caller, msg (+ stacktrace at/above the stacktrace level)."""

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
        stack = ""
        if record.exc_info:
            stack = self.formatException(record.exc_info)
        elif record.levelno >= self.stacktrace_level:
            stack = "".join(traceback.format_stack()[:-8]).rstrip()
        if self.encoder == "json":
            out: dict[str, Any] = {
                "level": _zap_level(record.levelno),
                "ts": self._ts(record.created),
                "logger": record.name,
                "caller": caller,
                "msg": msg,
            }
            if stack:
                out["stacktrace"] = stack
            return json.dumps(out, default=str)
        ts = self._ts(record.created)
        line = f"{ts}\t{_zap_level(record.levelno).upper()}\t{record.name}\t{caller}\t{msg}"
        return f"{line}\n{stack}" if stack else line


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


def setup_logging(opts: Options) -> None:
    devel = opts.zap_devel
    encoder = opts.zap_encoder or ("console" if devel else "json")
    time_encoding = opts.zap_time_encoding or ("iso8601" if encoder == "console" else "rfc3339")
    if opts.zap_stacktrace_level:
        stack_level = {"info": logging.INFO, "error": logging.ERROR, "panic": logging.CRITICAL}[
            opts.zap_stacktrace_level
        ]
    else:
        stack_level = logging.WARNING if devel else logging.ERROR
    handler = _StderrHandler()
    handler.setFormatter(ZapFormatter(encoder, time_encoding, stack_level))
    root = logging.getLogger()
    for h in list(root.handlers):
        if isinstance(h, _StderrHandler):
            root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(python_level(opts))
