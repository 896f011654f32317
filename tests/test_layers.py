"""The import contracts `make lint` runs: the one-way layers and the independent plugin folders are kept on this
tree, each catches a back-edge, and the folder contract lists every plugin folder."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
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
    assert "3 kept, 0 broken" in r.stdout


def test_the_folder_contracts_name_every_plugin_folder() -> None:
    folders = {p.name for p in (ROOT / "epp" / "plugins").iterdir() if (p / "__init__.py").exists()} - {"contracts"}
    contracts = {
        c["id"]: c for c in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    }
    expected = {f"epp.plugins.{f}" for f in folders}
    assert set(contracts["plugin-folders"]["modules"]) == expected
    assert set(contracts["plugin-contracts"]["forbidden_modules"]) == expected


@pytest.mark.parametrize(
    ("module", "back_edge", "reported"),
    [
        # a plugin reaching into the KV-event machinery instead of the framework's KVCacheIndex
        ("epp/plugins/scorers/queue_scorer.py", "import epp.kvcache.tokens", "epp.plugins.scorers.queue_scorer"),
        # the framework importing a plugin (the old registry did)
        ("epp/framework/registry.py", "import epp.plugins.scorers.queue_scorer", "epp.framework.registry"),
        # request control reading the config layer
        ("epp/requestcontrol/director.py", "import epp.config.loader", "epp.requestcontrol.director"),
        # a scorer taking a producer's module for its data instead of epp.plugins.contracts
        (
            "epp/plugins/scorers/token_load_scorer.py",
            "import epp.plugins.producers.inflight_load_producer",
            "epp.plugins.scorers.token_load_scorer",
        ),
        # a contract depending on a plugin
        (
            "epp/plugins/contracts/load.py",
            "import epp.plugins.producers.inflight_load_producer",
            "epp.plugins.contracts",
        ),
    ],
)
def test_a_back_edge_breaks_the_contract(tree: Path, module: str, back_edge: str, reported: str) -> None:
    path = tree / module
    path.write_text(path.read_text() + f"\n{back_edge}  # noqa: E402, F401\n")
    r = lint(tree)
    assert r.returncode != 0
    assert "0 broken" not in r.stdout and reported in r.stdout, r.stdout
