"""The short fuzz pass of `make test` (CI): each target a few seconds from its seeds, which must all pass first.
`make fuzz` runs the long one (10 minutes a target)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fuzz.seeds import SEEDS
from fuzz.targets import TARGETS

SHORT_SECONDS = 4


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_seeds_pass(target: str) -> None:
    seeds = list(SEEDS[target]())
    assert len(seeds) >= 5
    for seed in seeds:
        TARGETS[target](seed)


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_short_fuzz_pass_finds_no_crash(target: str, tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "fuzz.run", target, "--seconds", str(SHORT_SECONDS), "--corpus-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parent.parent,
    )
    tail = r.stderr[-3000:]
    assert r.returncode == 0 and not list(tmp_path.glob("crash-*")), tail
    runs = [line for line in r.stderr.splitlines() if line.startswith("Done ")]
    assert runs and int(runs[-1].split()[1]) > 10, tail
