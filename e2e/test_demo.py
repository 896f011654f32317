"""`python -m e2e.demo` runs end to end (what `make demo` calls)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from e2e.harness.procs import REPO_ROOT

pytestmark = pytest.mark.e2e


def test_demo_routes_and_prints() -> None:
    r = subprocess.run([sys.executable, "-m", "e2e.demo"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "served by backend-0" in r.stdout
    assert "served by backend-1" in r.stdout
    assert "bad JSON -> 400" in r.stdout
    assert "backend saw 169.254.169.254:80" not in r.stdout
