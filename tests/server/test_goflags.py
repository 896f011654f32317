"""Flag defaults in `epp serve --help` as pflag prints them: Go durations, quoted strings, zero values left out; and
docs/flags.md's defaults are the ones the help prints."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from epp.server.goflags import Flag, FlagSet, go_duration
from epp.server.options import FLAGSET

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("seconds", "go"),
    [(30, "30s"), (60, "1m0s"), (90, "1m30s"), (3600, "1h0m0s"), (5400.5, "1h30m0.5s"), (1.5, "1.5s"),
     (0.05, "50ms"), (0.0005, "500µs"), (2e-9, "2ns"), (0, "0s"), (-2, "-2s"), (0.1234, "123.4ms")],
)  # fmt: skip
def test_go_duration_strings(seconds: float, go: str) -> None:
    assert go_duration(seconds) == go


def test_usage_prints_defaults_in_go_syntax() -> None:
    flags = FlagSet(
        [Flag("wait", "duration", "W."), Flag("off", "duration", "O."), Flag("name", "string", "N."),
         Flag("n", "int", "Count."), Flag("ratio", "float", "R."), Flag("on", "bool", "B."),
         Flag("ports", "ints", "P.")],
        {"wait": 30.0, "off": 0.0, "name": 'a "b"', "n": 0, "ratio": 1.0, "on": True, "ports": [8000, 8001]},
    )  # fmt: skip
    text = flags.usage()
    assert "W. (default 30s)" in text and "O.\n" in text  # a zero duration is not printed, as pflag
    assert 'N. (default "a \\"b\\"")' in text and "Count.\n" in text
    assert "R. (default 1)" in text and "B. (default true)" in text and "P. (default [8000,8001])" in text


def test_docs_flag_defaults_match_the_help() -> None:
    """Every docs/flags.md row of duration flags (`--a` / `--b` | x / y) says the defaults the help prints."""
    checked = 0
    for line in (ROOT / "docs/flags.md").read_text().splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) < 4 or not cells[1].startswith("`--"):
            continue
        names = re.findall(r"`--([a-z0-9-]+)`", cells[1])
        defaults = [d.strip() for d in cells[2].split(" / ")]
        for name, doc in zip(names, defaults, strict=False):
            flag = FLAGSET.by_name.get(name)
            if flag is None or flag.kind != "duration" or len(names) != len(defaults):
                continue
            assert go_duration(FLAGSET.defaults[flag.attr]) == doc.strip("`*"), name
            assert f"(default {doc.strip('`*')})" in FLAGSET.usage() or doc == "0s"
            checked += 1
    assert checked >= 4
