"""cost.picks' `--pythons`: each named interpreter is checked up front and is the one the EPP and the floor run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from e2e.bench.cost.breakdown import FloorProcess
from e2e.bench.cost.picks import parse_pythons
from e2e.harness.procs import EppProcess


def _wrapper(tmp_path: Path, name: str, body: str) -> str:
    """An executable standing in for an interpreter: `body` is its shell script."""
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def test_no_pythons_is_this_interpreter_and_names_map_to_paths() -> None:
    assert parse_pythons("") == [("", None)]
    assert parse_pythons(f"venv,other={sys.executable}") == [("venv", None), ("other", sys.executable)]


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ("a,a", "a name of its own"),
        ("=x", "a name of its own"),
        ("image=", "no interpreter after"),
        ("image=/nonexistent/python3", "cannot run"),
    ],
)
def test_bad_pythons_are_refused_with_the_cause(spec: str, why: str) -> None:
    with pytest.raises(SystemExit, match=why):
        parse_pythons(spec)


def test_an_interpreter_without_the_dependencies_is_refused(tmp_path: Path) -> None:
    bare = _wrapper(tmp_path, "bare-python", "echo \"ModuleNotFoundError: No module named 'grpc'\" >&2\nexit 1\n")
    with pytest.raises(SystemExit, match=r"lacks the EPP's dependencies .*No module named 'grpc'"):
        parse_pythons(f"image={bare}")


def test_the_epp_runs_under_the_given_interpreter(tmp_path: Path) -> None:
    marker = tmp_path / "argv"
    fake = _wrapper(tmp_path, "py", f'echo "$@" > {marker}\n')
    epp = EppProcess(tmp_path / "epp.yaml", tmp_path, python=fake)
    assert epp.proc.wait(timeout=30) == 0
    epp.stop()
    assert marker.read_text().startswith(f"-m epp serve --config {tmp_path / 'epp.yaml'}")


def test_the_floor_runs_under_the_given_interpreter(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    # a real interpreter behind a wrapper that leaves a mark: the floor must also serve through it
    shim = _wrapper(tmp_path, "py", f'touch {marker}\nexec {sys.executable} "$@"\n')
    floor = FloorProcess(tmp_path, "127.0.0.1:8000", python=shim)
    try:
        floor.wait_ready(60)
    finally:
        floor.stop()
    assert marker.exists()
