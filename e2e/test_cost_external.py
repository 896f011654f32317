"""--external in the cost benchmarks: another EPP from its command line (here pyepp's own, e2e/external/pyepp.yaml)
measured by cost.overhead (through the same Envoy, CPU per request from /proc) and cost.picks (h2load straight to
its ext_proc port, its picks counted from its metrics), as ours is."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from e2e.harness.procs import REPO_ROOT

pytestmark = pytest.mark.e2e
SPEC = "ext=e2e/external/pyepp.yaml"


def _run(args: list[str], timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)


def test_overhead_measures_an_external_epp_beside_the_floor(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    r = _run(["-m", "e2e.bench.cost.overhead", "--points", "1024:20", "--duration", "2", "--idle", "1",
              "--strategies", "ext,floor", "--external", SPEC, "--json", str(out)])  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = {row["strategy"]: row for row in json.loads(out.read_text())}
    assert set(rows) == {"ext", "floor"}
    for row in rows.values():
        assert row["errors"] == 0 and row["n"] == 80
        assert row["gw_p50_ms"] > 0 and row["direct_p50_ms"] > 0
    # the external EPP's own process did the work: a pick costs CPU (whole /proc ticks over 40 requests)
    assert rows["ext"]["cpu_us_per_request"] > 0


def test_picks_counts_an_external_epps_picks(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    r = _run(["-m", "e2e.bench.cost.picks", "--workers", "1", "--strategy", "ext", "--external", SPEC,
              "--streams", "300", "--json", str(out)])  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (row,) = json.loads(out.read_text())
    assert row["strategy"] == "ext" and row["failed"] == 0
    assert row["picks_counted"] == row["succeeded"] == 300  # the EPP's own metric: every stream was a pick
    assert row["cpu_us_per_pick"] > 0


def test_a_spec_whose_binary_is_unset_is_refused_before_anything_starts(tmp_path: Path) -> None:
    spec = tmp_path / "x.yaml"
    spec.write_text("command: ${NO_SUCH_EPP_BINARY} --grpc-port {grpc_port}\nconfig: 'plugins: []'\n")
    for bench in ("overhead", "picks"):
        r = _run(["-m", f"e2e.bench.cost.{bench}", "--external", f"x={spec}"], timeout=60)
        assert r.returncode == 2 and "NO_SUCH_EPP_BINARY is not set" in r.stderr, (bench, r.stderr[-2000:])
