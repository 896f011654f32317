"""The real `helm` CLI (helm.sh/helm/v4, built from the Go module proxy by `make helm`) for the chart tests:
`helm template`, `helm lint` and `helm show crds`, with values written to a file as `helm -f` reads them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import yaml

HELM_VERSION = "v4.3.2"
# Where the Makefile's `helm` target installs it (outside the clone, so CI's fresh clones reuse it).
INSTALLED = Path.home() / ".cache" / "pyepp" / "tools" / f"helm-{HELM_VERSION}" / "helm"


class HelmError(Exception):
    """`helm` exited non-zero; the message is its stderr (e.g. a template's `fail`)."""


@cache
def binary() -> str:
    """$HELM, else the Makefile's install, else `helm` on PATH: it must be the pinned version."""
    path = os.environ.get("HELM") or (str(INSTALLED) if INSTALLED.is_file() else shutil.which("helm"))
    if not path:
        raise RuntimeError(f"the helm CLI is not installed: `make helm` builds {HELM_VERSION} into {INSTALLED}")
    out = subprocess.run([path, "version", "--template", "{{.Version}}"], capture_output=True, text=True, check=True)
    if not HELM_VERSION.startswith(out.stdout.strip()):  # a module build says "v4.3" (no VCS stamp)
        raise RuntimeError(f"{path} is helm {out.stdout.strip()}, not {HELM_VERSION}: `make helm` builds that")
    return path


def run(*args: str, values: dict[str, Any] | None = None) -> str:
    """`helm ARGS [-f values.yaml]`; its stdout, or HelmError with its stderr."""
    return _run(args, None if values is None else json.dumps(values, sort_keys=True))


@cache  # the chart does not change during a test run; many tests render the same values
def _run(args: tuple[str, ...], values: str | None) -> str:
    with tempfile.TemporaryDirectory(prefix="pyepp-helm-") as tmp:
        argv = [binary(), *args]
        if values is not None:
            f = Path(tmp) / "values.yaml"
            f.write_text(values)  # JSON is YAML, and keeps every scalar's type
            argv += ["-f", str(f)]
        env = {**os.environ, "HELM_CACHE_HOME": tmp, "HELM_CONFIG_HOME": tmp, "HELM_DATA_HOME": tmp}
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    if done.returncode != 0:
        raise HelmError(done.stderr.strip() or done.stdout.strip())
    return done.stdout


def template(
    chart: Path, values: dict[str, Any], *, name: str, namespace: str, kube_version: str | None = None
) -> list[dict[str, Any]]:
    """`helm template NAME CHART -n NS -f values`: the rendered objects (NOTES.txt is not among them)."""
    args = ["template", name, str(chart), "--namespace", namespace]
    if kube_version:
        args += ["--kube-version", kube_version]
    return [d for d in yaml.safe_load_all(run(*args, values=values)) if d]


def lint(chart: Path, values: dict[str, Any], *, kube_version: str) -> str:
    """`helm lint --strict` (warnings fail it too): its report, or HelmError."""
    return run("lint", str(chart), "--strict", "--kube-version", kube_version, values=values)


def crds(chart: Path) -> list[dict[str, Any]]:
    """`helm show crds CHART`."""
    return [d for d in yaml.safe_load_all(run("show", "crds", str(chart))) if d]


def notes(chart: Path, values: dict[str, Any], *, name: str, namespace: str) -> str:
    """NOTES.txt as `helm install --dry-run=client` prints it (no cluster asked)."""
    out = run("install", name, str(chart), "--namespace", namespace, "--dry-run=client", values=values)
    return out.partition("NOTES:\n")[2]
