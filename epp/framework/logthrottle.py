"""Rate-limited logging for messages a flood can trigger (malformed ZMQ frames, bad token ids, bad bodies).

`LogThrottle.allow(key)` is True at most once per `interval` per key; the calls it refused since the last
allowed one are reported with the next allowed line, so nothing is hidden, only summarised. Counters (Prometheus)
stay exact: throttle the log line, never the metric.
"""

from __future__ import annotations

import logging
import time


class LogThrottle:
    __slots__ = ("_last", "_suppressed", "interval", "max_keys")

    def __init__(self, interval: float = 5.0, max_keys: int = 256) -> None:
        self.interval = interval
        self.max_keys = max_keys
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def allow(self, key: str) -> tuple[bool, int]:
        """(log now?, how many lines of this key were suppressed since the last one logged)."""
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last < self.interval:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return False, 0
        if last is None and len(self._last) >= self.max_keys:  # keys are ours, but stay bounded anyway
            self._last.clear()
            self._suppressed.clear()
        self._last[key] = now
        return True, self._suppressed.pop(key, 0)

    def log(
        self, logger: logging.Logger, level: int, key: str, msg: str, *args: object, exc_info: bool = False
    ) -> bool:
        """Log `msg` unless `key` was logged within the interval; says how many were suppressed meanwhile."""
        ok, suppressed = self.allow(key)
        if not ok:
            return False
        if suppressed:
            msg += " (%d similar messages suppressed in the last %.0f s)"
            args = (*args, suppressed, self.interval)
        logger.log(level, msg, *args, exc_info=exc_info)
        return True
