"""The one-way layer contract (`make lint` runs it): kept on this tree, and it catches a back-edge."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint(tree: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}  # analyse this copy, not the installed package
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=tree, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "epp", tmp_path / "epp", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_contract_is_kept(tree: Path) -> None:
    r = lint(tree)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 kept, 0 broken" in r.stdout


@pytest.mark.parametrize(
    ("module", "back_edge", "reported"),
    [
        # a plugin reaching into the KV-event machinery instead of the framework's KVCacheIndex
        ("epp/plugins/scorers/queue_scorer.py", "import epp.kvcache.tokens", "epp.plugins.scorers.queue_scorer"),
        # the framework importing a plugin (the old registry did)
        ("epp/framework/registry.py", "import epp.plugins.scorers.queue_scorer", "epp.framework.registry"),
        # request control reading the config layer
        ("epp/requestcontrol/director.py", "import epp.config.loader", "epp.requestcontrol.director"),
    ],
)
def test_a_back_edge_breaks_the_contract(tree: Path, module: str, back_edge: str, reported: str) -> None:
    path = tree / module
    path.write_text(path.read_text() + f"\n{back_edge}  # noqa: E402, F401\n")
    r = lint(tree)
    assert r.returncode != 0
    assert "1 broken" in r.stdout and reported in r.stdout, r.stdout
