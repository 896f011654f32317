"""`python -m e2e.demo --quick` runs end to end (what `make demo` calls, scaled down)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from e2e.bench.loadgen import percentile
from e2e.harness.procs import REPO_ROOT

pytestmark = pytest.mark.e2e


def test_demo_quick_compares_strategies(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "e2e.demo", "--quick", "--strategies", "precise,random", "--out", str(tmp_path)]
    r = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=480)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "precise" in r.stdout and "random" in r.stdout and "TTFT p50" in r.stdout
    doc = json.loads((tmp_path / "demo-results.json").read_text())
    by_label = {s["label"]: s for s in doc["summaries"]}
    assert by_label["precise"]["ok"] == by_label["precise"]["n"] > 20
    assert doc["cells"][0]["workload"] == "demo" and 0.5 < doc["cells"][0]["bound"] < 1
    # every request is a real row (its pod, timings, tokens, group); the warm-up ones are kept and marked
    rows = doc["results"]["demo"]["precise"]
    assert all(r["served_by"] and r["e2e"] >= r["ttft"] > 0 and r["completion_tokens"] > 0 and r["group"]
               for r in rows)  # fmt: skip
    assert all(0 <= r["hit"] <= 1 and r["hit"] == round(r["cached_tokens"] / r["prompt_tokens"], 4) for r in rows)
    counted = [r for r in rows if r["counted"]]
    assert 0 < len(counted) < len(rows)
    assert all(r["arrival"] >= doc["cells"][0]["params"]["warmup_s"] for r in counted)
    # the table's p90 is the counted rows' p90 (what demo-ttft.png plots)
    assert percentile([r["ttft"] for r in counted], 0.9) == pytest.approx(by_label["precise"]["ttft_p90"])
    assert by_label["precise"]["kv_hit_rate"] > by_label["random"]["kv_hit_rate"]
    # progress on stderr (not a terminal here: periodic lines, one per strategy at least)
    assert "demo [1/2] precise: " in r.stderr and "demo [2/2] random: " in r.stderr
    assert (tmp_path / "demo-ttft.png").stat().st_size > 10_000
    assert (tmp_path / "demo.png").stat().st_size > 10_000


def test_per_draw_ratios_pair_ours_with_each_strategy_draw_by_draw() -> None:
    from e2e.bench.routing.suite import Cell
    from e2e.demo import parse_args, per_draw, times

    cell = Cell("demo", 4, 16, 10, 1.0, 0.9, {})
    cell.summaries = [{"label": "llm-d-v0.10", "ttft_p90": 0.14}, {"label": "pyepp-default", "ttft_p90": 0.15}]
    cell.repeats = [
        [{"label": "pyepp-default", "ttft_p90": 0.15}, {"label": "llm-d-v0.10", "ttft_p90": 0.14}],
        [{"label": "pyepp-default", "ttft_p90": 0.10}, {"label": "llm-d-v0.10", "ttft_p90": 0.20}],
    ]
    assert per_draw(cell) == "llm-d-v0.10 0.93, 2.00"
    assert (times(0.934), times(13.46), times(213.1)) == ("0.93x", "13.5x", "213.1x")
    assert parse_args(["--draws", "3"]).draws == 3
    with pytest.raises(SystemExit):
        parse_args(["--draws", "0"])
