"""Logging as the anchors do it: `-v` maps onto zap levels step by step, their production JSON line by default,
stack traces only from ERROR (or from the level the zap flags ask for), and zap's sampler."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest

from epp.framework.verbosity import DEBUG, DEFAULT, TRACE, VERBOSE, V
from epp.server.logsetup import ZapFormatter, ZapSampler, python_level, setup_logging
from epp.server.options import parse_options

LOG = logging.getLogger("epp.test.logsetup")


@pytest.fixture(autouse=True)
def _restore_root() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def _lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return [x for x in capsys.readouterr().err.splitlines() if x]


def _shown(argv: list[str], capsys: pytest.CaptureFixture[str]) -> list[int]:
    """The verbosities whose V(n) line `epp serve ARGV` writes."""
    setup_logging(parse_options(argv))
    capsys.readouterr()
    for n in range(7):
        LOG.log(V(n), "line at V(%d)", n)
    return [int(json.loads(x)["msg"].rsplit("(", 1)[1][:-1]) for x in _lines(capsys)]


def test_every_step_of_v_counts_as_in_the_anchors(capsys: pytest.CaptureFixture[str]) -> None:
    """zap's level is -v (LoggingOptions.Complete): a V(n) line shows when n <= v, for every v, not only at 4."""
    assert _shown([], capsys) == [0, 1, 2]  # -v=2, the default
    for v in range(7):
        assert _shown([f"--v={v}"], capsys) == list(range(v + 1)), v
    # --zap-log-level overrides -v as controller-runtime parses it: debug is zap's -1, i.e. V(1); n is V(n)
    assert _shown(["--zap-log-level=debug", "--v=5"], capsys) == [0, 1]
    assert _shown(["--zap-log-level=info", "--v=5"], capsys) == [0]
    assert _shown(["--zap-log-level=3"], capsys) == [0, 1, 2, 3]
    assert _shown(["--zap-log-level=error"], capsys) == []
    assert _shown(["--log-level=debug", "--v=0"], capsys) == [0, 1, 2, 3, 4]  # pyepp's --log-level wins


def test_level_resolution() -> None:
    def level(argv: list[str]) -> int:
        return python_level(parse_options(argv))

    assert level([]) == V(DEFAULT) and V(0) == logging.INFO and V(DEBUG) == logging.DEBUG
    assert logging.INFO > V(1) > V(DEFAULT) > V(VERBOSE) > logging.DEBUG > V(TRACE) > V(6) > 0
    assert level(["--zap-log-level=error", "--log-level=warning"]) == logging.WARNING


def test_level_names_are_the_anchors(capsys: pytest.CaptureFixture[str]) -> None:
    """Their LevelEncoder: V(1)-V(3) are "info", V(4) "debug", V(5) and beyond "trace"."""
    setup_logging(parse_options(["--v=6"]))
    for n in (0, 3, 4, 5, 6):
        LOG.log(V(n), "x")
    LOG.warning("x")
    assert [json.loads(x)["level"] for x in _lines(capsys)] == ["info", "info", "debug", "trace", "trace", "warn"]


def _warn_and_error_with_an_exception() -> None:
    try:
        raise TypeError("TextInputSequence must be str")
    except TypeError:
        LOG.warning("skipping a bad event", exc_info=True)
        LOG.error("handler failed", exc_info=True)


@pytest.mark.parametrize("argv", [[], ["--zap-encoder", "json"], ["--zap-devel=false"]])
def test_a_warn_carries_no_stack_dump_by_default(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """The anchors' logger (and their charts' `--zap-encoder json`): production JSON, epoch `ts`, stack traces
    from ERROR up; the `--zap-devel` default (true) changes nothing there and here."""
    setup_logging(parse_options(argv))
    _warn_and_error_with_an_exception()
    warn, error = (json.loads(x) for x in _lines(capsys))
    assert warn["level"] == "warn" and warn["error"] == "TypeError: TextInputSequence must be str"
    assert "stacktrace" not in warn and isinstance(warn["ts"], float)
    assert error["level"] == "error" and "Traceback" in error["stacktrace"] and error["error"].startswith("TypeError")


def test_stack_dumps_under_warns_when_asked_for(capsys: pytest.CaptureFixture[str]) -> None:
    setup_logging(parse_options(["--zap-stacktrace-level=info"]))
    _warn_and_error_with_an_exception()
    warn = json.loads(_lines(capsys)[0])
    assert "Traceback" in warn["stacktrace"]
    # --zap-devel given: controller-runtime's development defaults (console lines, stack traces from WARN)
    setup_logging(parse_options(["--zap-devel"]))
    _warn_and_error_with_an_exception()
    out = capsys.readouterr().err
    head = out.splitlines()[0].split("\t")
    assert head[1:5] == ["WARN", "epp.test.logsetup", head[3], "skipping a bad event"]
    assert out.count("Traceback") == 2


def test_sampler_passes_the_first_hundred_then_every_hundredth(capsys: pytest.CaptureFixture[str]) -> None:
    """zap's sampler in the anchors' production logger: 250 identical warnings in a second write 101 lines, other
    messages are counted apart; development mode does not sample."""
    setup_logging(parse_options([]))
    for i in range(250):
        LOG.warning("flood %d", i)
    LOG.warning("another message")
    lines = [json.loads(x)["msg"] for x in _lines(capsys)]
    assert lines[:100] == [f"flood {i}" for i in range(100)]
    assert lines[100:] == ["flood 199", "another message"]
    setup_logging(parse_options(["--zap-devel"]))
    for i in range(250):
        LOG.warning("flood %d", i)
    assert sum("\tWARN\t" in x for x in _lines(capsys)) == 250


def test_sampler_window_resets() -> None:
    s = ZapSampler(tick=0.0, first=1, thereafter=0)
    rec = logging.LogRecord("x", logging.WARNING, "f.py", 1, "m", (), None)
    assert all(s.filter(rec) for _ in range(5))  # every tick is new
    s = ZapSampler(tick=60.0, first=2, thereafter=0)
    assert [s.filter(rec) for _ in range(4)] == [True, True, False, False]
    verbose = logging.LogRecord("x", V(DEFAULT), "f.py", 1, "m", (), None)
    assert all(s.filter(verbose) for _ in range(5))  # zap samples from its Debug (V(1)) up only


def test_zap_json_line() -> None:
    record = logging.LogRecord("epp.x", logging.WARNING, "/a/b/file.py", 12, "hello %s", ("you",), None)
    line = json.loads(ZapFormatter("json", "epoch", logging.ERROR).format(record))
    assert line["level"] == "warn" and line["msg"] == "hello you" and line["logger"] == "epp.x"
    assert line["caller"] == "file.py:12" and isinstance(line["ts"], float) and "stacktrace" not in line
    line = json.loads(ZapFormatter("json", "rfc3339", logging.WARNING).format(record))
    assert "stacktrace" in line and line["ts"].count(":") >= 2
    console = ZapFormatter("console", "millis", logging.ERROR).format(record)
    assert console.split("\t")[1:] == ["WARN", "epp.x", "file.py:12", "hello you"]
