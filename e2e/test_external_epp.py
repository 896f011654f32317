"""--external: another EPP from its command line (here pyepp's own, e2e/external/pyepp.yaml) runs in the routing
suite beside a built-in strategy, on the same pods and requests, and lands in the same report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from e2e.harness.procs import REPO_ROOT

pytestmark = pytest.mark.e2e


def test_suite_runs_an_external_epp_beside_a_builtin_strategy(tmp_path: Path) -> None:
    cmd = [
        sys.executable, "-m", "e2e.bench.routing.suite", "--workloads", "no-reuse", "--cells", "2:16",
        "--scale", "0.45", "--strategies", "ext,load", "--external", "ext=e2e/external/pyepp.yaml",
        "--out", str(tmp_path),
    ]  # fmt: skip
    r = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    doc = json.loads((tmp_path / "results.json").read_text())
    (cell,) = doc["cells"]
    by_label = {s["label"]: s for s in cell["summaries"]}
    assert set(by_label) == {"ext", "load"}
    ext = by_label["ext"]
    assert ext["ok"] == ext["n"] == by_label["load"]["n"] >= 8
    # the pods have their own loopback addresses (pod discovery) and the external EPP spread over both
    served = {row["served_by"] for row in doc["requests"]["no-reuse/2/16/ext"]}
    assert served == {"sim-127-0-0-2", "sim-127-0-0-3"}
    assert "| ext |" in (tmp_path / "results.md").read_text()


def test_unknown_external_spec_is_refused_before_anything_starts(tmp_path: Path) -> None:
    spec = tmp_path / "x.yaml"
    spec.write_text("command: ${NO_SUCH_EPP_BINARY} --grpc-port {grpc_port}\nconfig: 'plugins: []'\n")
    cmd = [sys.executable, "-m", "e2e.bench.routing.suite", "--external", f"x={spec}", "--strategies", "x"]
    r = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "NO_SUCH_EPP_BINARY is not set" in r.stderr
