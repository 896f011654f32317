"""Progress of long runs: periodic lines off a terminal (CI logs), a tqdm bar on one."""

from __future__ import annotations

import io

import pytest

from e2e.bench.progress import Progress


def test_off_a_terminal_a_line_every_interval_and_one_at_the_end(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]
    monkeypatch.setattr("e2e.bench.progress.time.monotonic", lambda: now[0])
    out = io.StringIO()
    p = Progress("demo [2/5] precise", 200, stream=out, interval=10.0)
    for done in range(1, 201):
        now[0] = done * 0.25  # 4 requests a second: 50 s in all
        p(done, 200)
    lines = out.getvalue().splitlines()
    assert lines[0] == "  demo [2/5] precise: 40/200 requests, 10s elapsed, ~40s left"
    assert len(lines) == 5 and lines[-1] == "  demo [2/5] precise: 200/200 requests in 50s"
    assert "\r" not in out.getvalue()


def test_on_a_terminal_a_bar() -> None:
    out = io.StringIO()
    p = Progress("multi-turn [1/5] random", 10, stream=out, tty=True)
    for done in range(1, 11):
        p(done, 10)
    text = out.getvalue()
    assert "multi-turn [1/5] random" in text and "10/10" in text and "\r" in text
