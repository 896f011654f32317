"""Config parity: another EPP binary and pyepp on every config of the anchor corpus; which one accepts, which one
rejects, and why.

    python -m e2e.config_parity --binary /path/to/llm-d-epp [--out parity.md] [--only SUBSTRING] [--jobs 1]

The binary is given, never built here. Each config (tests/corpus/anchors, provenance in tests/corpus/manifest.tsv)
is started with the binary's defaults but its ports; without Kubernetes, a config that names no discovery plugin
gets llm-d's `file-discovery` one (docs/discovery.md of llm-d-router) over an endpoints file written here, and a
config that names one (`file-discovery`, `multicluster-file-discovery`) gets that file as its `path` (its own
path would name a file that is not on this machine).
The binary accepts a config when it logs `EPP starting (file discovery mode)` and is still running a moment later;
it rejects it when it exits (the reason: its last error line). pyepp runs `epp validate` on the same file, which
makes the checks `epp serve` makes before it binds anything.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from e2e.harness.ports import free_ports

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "tests" / "corpus" / "anchors"
ENDPOINTS = "endpoints:\n- {name: parity-0, address: 127.0.0.1, port: '18000'}\n"
DISCOVERY = "parity-file-discovery"
STARTED = "EPP starting (file discovery mode)"
# discovery plugins reading an endpoints file in file-discovery's format (its path is rewritten to ours)
FILE_DISCOVERY = ("file-discovery", "multicluster-file-discovery")


@dataclass
class Verdict:
    accepted: bool
    reason: str = ""


def prepared(text: str, endpoints: Path) -> str:
    """The config as both EPPs get it: with a file-discovery plugin over `endpoints` (see the module docstring).
    Text that is not a YAML mapping is passed on as it is (both should reject it)."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if doc is None:  # an empty config: the defaults
        doc = {}
    if not isinstance(doc, dict):
        return text
    plugins = doc.get("plugins")
    if plugins is not None and not isinstance(plugins, list):
        return text
    plugins = list(plugins or [])
    found = False
    for p in plugins:
        if isinstance(p, dict) and p.get("type") in FILE_DISCOVERY:
            params = p.get("parameters")
            p["parameters"] = {**(params if isinstance(params, dict) else {}), "path": str(endpoints)}
            found = True
    layer = doc.get("dataLayer")
    if layer is not None and not isinstance(layer, dict):
        return text
    layer = dict(layer or {})
    if not layer.get("discovery"):
        if not found:
            plugins.append({"name": DISCOVERY, "type": "file-discovery", "parameters": {"path": str(endpoints)}})
            layer["discovery"] = {"pluginRef": DISCOVERY}
        else:
            name = next(p.get("name") or p["type"] for p in plugins if p.get("type") in FILE_DISCOVERY)
            layer["discovery"] = {"pluginRef": name}
    doc["plugins"] = plugins
    doc["dataLayer"] = layer
    return yaml.safe_dump(doc, sort_keys=False)


def _last_error(log: str) -> str:
    """The binary's last error line (zap JSON: msg and error), else its last line."""
    last = ""
    for line in log.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            d: dict[str, Any] = json.loads(line)
        except ValueError:
            last = line
            continue
        if d.get("level") in ("error", "fatal", "panic"):
            last = f"{d.get('msg', '')}: {d.get('error', '')}".strip(": ")
    return last[:400]


def run_binary(binary: Path, config: Path, workdir: Path, timeout: float, alpha: bool = False) -> Verdict:
    grpc, health, metrics = free_ports(3)
    log_path = workdir / f"{config.stem}.log"
    argv = [str(binary), "--config-file", str(config), "--pool-name", "parity", "--pool-namespace", "parity",
            "--grpc-port", str(grpc), "--grpc-health-port", str(health), "--metrics-port", str(metrics),
            *(["--allow-experimental-plugins"] if alpha else [])]  # fmt: skip
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=workdir)
        try:
            deadline = time.monotonic() + timeout
            started_at: float | None = None
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    return Verdict(
                        False, _last_error(log_path.read_text(errors="replace")) or f"exit {proc.returncode}"
                    )
                if started_at is None and STARTED in log_path.read_text(errors="replace"):
                    started_at = time.monotonic()
                if started_at is not None and time.monotonic() - started_at > 1.0:
                    return Verdict(True)
                time.sleep(0.1)
            return Verdict(False, f"neither started nor exited in {timeout:.0f} s")
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def run_ours(config: Path, alpha: bool = False) -> Verdict:
    """`epp validate` in this process (the checks `epp serve` makes on a config before it binds anything)."""
    from epp.cli import main

    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        code = main(["validate", str(config), *(["--allow-experimental-plugins"] if alpha else [])])
    if code == 0:
        return Verdict(True)
    lines = [x for x in err.getvalue().splitlines() if x.startswith("error:")]
    return Verdict(False, (lines[-1][len("error: ") :] if lines else err.getvalue().strip())[:400])


def table(rows: Sequence[tuple[str, Verdict, Verdict]], binary: str) -> str:
    differ = [(f, b, o) for f, b, o in rows if b.accepted != o.accepted]
    out = [
        f"{len(rows)} configs; both accept {sum(b.accepted and o.accepted for _, b, o in rows)}, both reject "
        f"{sum(not b.accepted and not o.accepted for _, b, o in rows)}, differ {len(differ)} ({binary})",
        "",
        "| config | binary | pyepp |",
        "|---|---|---|",
    ]
    for f, b, o in differ:
        out.append(f"| {f} | {_cell(b)} | {_cell(o)} |")
    return "\n".join(out) + "\n"


def _cell(v: Verdict) -> str:
    return "accepts" if v.accepted else "rejects: " + v.reason.replace("|", "\\|").replace("\n", " ")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m e2e.config_parity", description=__doc__.split("\n\n")[0])
    p.add_argument("--binary", type=Path, required=True, help="the other EPP's executable (not built here)")
    p.add_argument("--corpus", type=Path, default=CORPUS)
    p.add_argument("--only", default="", help="only configs whose file name contains this")
    p.add_argument("--timeout", type=float, default=20.0, help="seconds for the binary to start or exit")
    p.add_argument("--out", type=Path, help="write the table (markdown) and every verdict (JSON beside it) here")
    p.add_argument("--all", action="store_true", help="list every config, not only those the two disagree on")
    p.add_argument(
        "--allow-experimental-plugins",
        action="store_true",
        help="both EPPs load Alpha plugins (else that check hides what either would say of the rest)",
    )
    ns = p.parse_args(argv)
    if not (ns.binary.is_file() and os.access(ns.binary, os.X_OK)):
        print(f"error: {ns.binary} is not an executable file", file=sys.stderr)
        return 2
    files = sorted(f for f in ns.corpus.glob("*.yaml") if ns.only in f.name)
    if not files:
        print(f"error: no configs in {ns.corpus} matching {ns.only!r}", file=sys.stderr)
        return 2
    rows: list[tuple[str, Verdict, Verdict]] = []
    with tempfile.TemporaryDirectory(prefix="pyepp-config-parity-") as tmp:
        work = Path(tmp)
        endpoints = work / "endpoints.yaml"
        endpoints.write_text(ENDPOINTS)
        for f in files:
            cfg = work / f.name
            cfg.write_text(prepared(f.read_text(), endpoints))
            theirs = run_binary(ns.binary, cfg, work, ns.timeout, ns.allow_experimental_plugins)
            ours = run_ours(cfg, ns.allow_experimental_plugins)
            rows.append((f.name, theirs, ours))
            mark = "=" if theirs.accepted == ours.accepted else "DIFFER"
            print(f"{mark:6} {f.name}: binary {_cell(theirs)[:100]} / pyepp {_cell(ours)[:100]}", flush=True)
    text = table(rows, str(ns.binary))
    if ns.all:
        text += "\n| config | binary | pyepp |\n|---|---|---|\n" + "".join(
            f"| {f} | {_cell(b)} | {_cell(o)} |\n" for f, b, o in rows
        )
    print("\n" + text)
    if ns.out:
        ns.out.write_text(text)
        verdicts = [{"file": f, "binary": vars(b), "pyepp": vars(o)} for f, b, o in rows]
        ns.out.with_suffix(".json").write_text(json.dumps(verdicts, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
