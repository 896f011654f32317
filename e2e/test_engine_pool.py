"""--engine: the routing suite's pods started from another server's command line (here e2e.sim itself, through
e2e/external/e2e-sim.yaml), restarted per run with their events dialled to that run's EPP; an engine that reports no
per-request cache hit gets n/a in the report, not a figure."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from e2e.harness.procs import REPO_ROOT

pytestmark = pytest.mark.e2e


def test_suite_routes_over_an_engine_pool_and_says_na_without_cached_tokens(tmp_path: Path) -> None:
    spec = tmp_path / "quiet-sim.yaml"
    text = (REPO_ROOT / "e2e/external/e2e-sim.yaml").read_text()
    spec.write_text(text.replace("cached_tokens: true", "cached_tokens: false"))
    cmd = [
        sys.executable, "-m", "e2e.bench.routing.suite", "--workloads", "shared-prefix-demo", "--cells", "2:16",
        "--scale", "0.3", "--strategies", "pyepp-default", "--engine", str(spec), "--out", str(tmp_path),
    ]  # fmt: skip
    r = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    doc = json.loads((tmp_path / "results.json").read_text())
    (cell,) = doc["cells"]
    (ours,) = cell["summaries"]
    assert ours["ok"] == ours["n"] >= 5
    rows = doc["requests"]["shared-prefix-demo/2/16/pyepp-default"]
    assert {row["served_by"] for row in rows} <= {"quiet-sim-0", "quiet-sim-1"}
    # the pods did cache (the engine reports it) but the spec says the report must not use it
    assert sum(row["cached_tokens"] for row in rows) > 0
    assert ours["kv_hit_rate"] != ours["kv_hit_rate"]  # NaN
    line = next(x for x in (tmp_path / "results.md").read_text().splitlines() if x.startswith("| pyepp-default"))
    assert "| n/a |" in line
