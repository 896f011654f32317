"""LogThrottle: one line per key per interval, with the count of lines suppressed meanwhile."""

from __future__ import annotations

import logging

import pytest

from epp.framework.logthrottle import LogThrottle


def test_one_line_per_key_per_interval(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr("epp.framework.logthrottle.time.monotonic", lambda: now[0])
    t = LogThrottle(interval=5.0)
    log = logging.getLogger("throttle-test")
    with caplog.at_level(logging.WARNING, "throttle-test"):
        for _ in range(1000):
            t.log(log, logging.WARNING, "frames", "bad message %d", 1)
        t.log(log, logging.WARNING, "seq", "bad seq")
        now[0] += 5.1
        t.log(log, logging.WARNING, "frames", "bad message %d", 2)
    assert [r.getMessage() for r in caplog.records] == [
        "bad message 1",
        "bad seq",
        "bad message 2 (999 similar messages suppressed in the last 5 s)",
    ]
