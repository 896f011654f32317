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

DEFAULT_VENV = Path(__file__).resolve().parents[2] / ".venv-ip"


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
