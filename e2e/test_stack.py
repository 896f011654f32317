"""`python -m e2e.stack up`: prints a working gateway URL, the EPP's metrics URL and a curl line; SIGTERM stops
Envoy, the EPP and every pod. A config with its own endpoints is refused with the reason."""

from __future__ import annotations

import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e


def _open(url: str) -> bool:
    host, port = re.sub(r"^https?://", "", url).split("/")[0].rsplit(":", 1)
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex((host, int(port))) == 0


def test_stack_up_serves_and_stops_on_sigterm(tmp_path: Path) -> None:
    cfg = tmp_path / "gie.yaml"
    cfg.write_text(Path("config/gie-default.yaml").read_text())
    argv = [sys.executable, "-m", "e2e.stack", "up", "--pods", "2", "--port", "0", "--config", str(cfg),
            "--workdir", str(tmp_path / "run")]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 120
        while not any(line.startswith("Ctrl-C") for line in out):
            line = proc.stdout.readline()
            assert line and time.monotonic() < deadline, "".join(out)
            out.append(line)
        text = "".join(out)
        gateway = re.search(r"^gateway +(\S+)", text, re.M)
        metrics = re.search(r"^EPP metrics +(\S+)", text, re.M)
        pods = re.findall(r"^pod \d+ +(\S+)", text, re.M)
        curl = next(line for line in out if line.startswith("curl "))
        assert gateway and metrics and len(pods) == 2, text
        answer = subprocess.run(shlex.split(curl), capture_output=True, text=True, timeout=30)
        assert '"chat.completion"' in answer.stdout, answer
        with urllib.request.urlopen(metrics.group(1), timeout=5) as r:
            assert b"inference_pool_ready_pods" in r.read()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(40) == 0, proc.stdout.read()
        assert not any(_open(u) for u in (gateway.group(1), metrics.group(1), *pods))
    finally:
        if proc.poll() is None:
            proc.kill()


def test_stack_refuses_a_config_with_endpoints(tmp_path: Path) -> None:
    cfg = tmp_path / "with-endpoints.yaml"
    cfg.write_text("endpoints: [{address: 10.0.0.1, port: 8000}]\n")
    r = subprocess.run([sys.executable, "-m", "e2e.stack", "up", "--config", str(cfg)], capture_output=True,
                       text=True, timeout=60)  # fmt: skip
    assert r.returncode != 0 and "has an `endpoints:` section" in r.stderr
