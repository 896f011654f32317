"""Drive a running stack with kubernetes-sigs' `inference-perf` (the field's own load generator).

inference-perf needs Python ≥ 3.12, so it lives in its own venv (`make inference-perf-venv` builds
`.venv-ip` from the machine's python3.12). This module writes its config (shared_prefix data, constant-rate
stages, streaming completions, our local Qwen2.5 tokenizer so nothing is fetched from a hub), runs it and
reads the summary report.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import yaml

from epp.tokenization.qwen import QWEN25_MODEL, qwen25_tokenizer_dir

DEFAULT_VENV = Path(__file__).resolve().parents[3] / ".venv-ip"


def binary(venv: Path = DEFAULT_VENV) -> Path:
    return Path(os.environ.get("INFERENCE_PERF", venv / "bin" / "inference-perf"))


def write_config(
    path: Path,
    *,
    base_url: str,
    report_dir: Path,
    num_groups: int,
    num_prompts_per_group: int,
    system_prompt_len: int,
    question_len: int,
    output_len: int,
    stages: list[tuple[float, int]],
    model: str = QWEN25_MODEL,
) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "api": {"type": "completion", "streaming": True},
        "data": {
            "type": "shared_prefix",
            "shared_prefix": {
                "num_groups": num_groups,
                "num_prompts_per_group": num_prompts_per_group,
                "system_prompt_len": system_prompt_len,
                "question_len": question_len,
                "output_len": output_len,
                "seed": 7,
            },
        },
        "load": {
            "type": "constant",
            "stages": [{"rate": rate, "duration": duration} for rate, duration in stages],
            "num_workers": 1,
            "worker_max_concurrency": 64,
        },
        "server": {"type": "vllm", "model_name": model, "base_url": base_url, "ignore_eos": True},
        "tokenizer": {"pretrained_model_name_or_path": str(qwen25_tokenizer_dir())},
        "storage": {"local_storage": {"path": str(report_dir)}},
        "report": {"request_lifecycle": {"summary": True, "per_stage": False, "per_request": False}},
    }
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return cfg


def run(config_path: Path, report_dir: Path, *, timeout: float = 900) -> dict[str, Any]:
    """Run inference-perf; return its summary report (the lifecycle-metrics JSON)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.run(
        [str(binary()), "-c", str(config_path)], capture_output=True, text=True, timeout=timeout, env=env
    )
    if proc.returncode != 0:
        raise RuntimeError(f"inference-perf failed ({proc.returncode}): {proc.stderr[-2000:]}")
    reports = sorted(report_dir.rglob("summary_lifecycle_metrics.json"))
    if not reports:
        raise RuntimeError(f"inference-perf wrote no summary under {report_dir}: {proc.stdout[-1000:]}")
    return dict(json.loads(reports[-1].read_text()))


def main(argv: list[str] | None = None) -> int:
    """Start 4 simulators and the gateway with one strategy, drive it with inference-perf, print its summary."""
    import argparse
    import tempfile

    from e2e.harness.stack import start_stack
    from e2e.sim.launch import start_simulators
    from e2e.strategies import config_text

    p = argparse.ArgumentParser(prog="python -m e2e.bench.routing.inference_perf")
    p.add_argument("--strategies", default="precise,random")
    p.add_argument("--rate", type=float, default=8.0)
    p.add_argument("--duration", type=int, default=20)
    ns = p.parse_args(argv)
    if not binary().exists():
        raise SystemExit(f"{binary()} not found: run `make inference-perf-venv` (or set INFERENCE_PERF)")
    sim_args = ["--num-gpu-blocks", "512", "--max-num-seqs", "4", "--prefill-time-per-token", "0.0005",
                "--inter-token-latency", "0.005", "--time-factor-under-load", "2"]  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="pyepp-ip-") as tmp, start_simulators(4, base_args=sim_args) as sims:
        for strategy in ns.strategies.split(","):
            work = Path(tmp) / strategy
            work.mkdir()
            stack = start_stack(
                work, backends=[], config=config_text(strategy, sims), epp_args=["--log-level", "warning"]
            )
            try:
                cfg = work / "inference-perf.yaml"
                write_config(
                    cfg, base_url=stack.url, report_dir=work / "reports", num_groups=16, num_prompts_per_group=8,
                    system_prompt_len=1024, question_len=64, output_len=16, stages=[(ns.rate, ns.duration)],
                )  # fmt: skip
                summary = run(cfg, work / "reports")
            finally:
                stack.close()
            succ = summary.get("successes", {})
            ttft = (succ.get("latency") or {}).get("time_to_first_token") or {}
            print(f"{strategy:<12} requests ok={succ.get('count')} failures={summary.get('failures', {}).get('count')} "
                  f"TTFT p50={ttft.get('median')} p90={ttft.get('p90')} (s)", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
