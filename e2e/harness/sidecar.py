"""The decode-side routing sidecar (`python -m epp.sidecar`) as a test process, in front of one simulator."""

from __future__ import annotations

import contextlib
import os
import sys
import time
import urllib.request
from pathlib import Path

from e2e.harness.ports import free_ports
from e2e.harness.procs import _Process


class SidecarProcess(_Process):
    def __init__(self, workdir: Path, model_server_port: int, *args: str) -> None:
        self.port, self.metrics_port = free_ports(2)
        self.model_server_port = model_server_port
        argv = [
            sys.executable, "-m", "epp.sidecar", "--port", str(self.port), "--model-server-port",
            str(model_server_port), "--secure-proxy=false", "--metrics-port", str(self.metrics_port), "-v", "4", *args,
        ]  # fmt: skip
        super().__init__(f"sidecar-{self.port}", argv, workdir / f"sidecar-{self.port}.log", env=dict(os.environ))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def hostport(self) -> str:
        return f"127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.running():
                raise self.fail(f"sidecar exited with {self.proc.returncode}")
            with contextlib.suppress(OSError), urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
            time.sleep(0.05)
        raise self.fail(f"sidecar not ready after {timeout}s")

    def metrics_text(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            text: str = r.read().decode()
        return text


def start_sidecar(workdir: Path, model_server_port: int, *args: str) -> SidecarProcess:
    s = SidecarProcess(workdir, model_server_port, *args)
    s.wait_ready()
    return s
