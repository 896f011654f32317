"""Run the built container image for real (CI's image step; `make image-check`): `epp serve` from the image as its
non-root user with a static config, gRPC health and /metrics checked from outside, and one request routed through
Envoy (from the dev venv) to a simulated vLLM pod.

    python -m e2e.image_check [--image localhost/pyepp:dev]

No Docker engine here: `buildah run --isolation chroot` runs the image's `epp` as uid 10001 with the host's network
(loopback), the config directory mounted read-only at /config. Prints one line per check; exits non-zero on the
first failure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from e2e.harness.envoy_config import EnvoyOptions
from e2e.harness.http import post_json
from e2e.harness.ports import free_ports
from e2e.harness.procs import EnvoyProcess
from e2e.sim.launch import start_simulators


def health(port: int, service: str = "readiness") -> int:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        return int(stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=1).status)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--image", default="localhost/pyepp:dev")
    ap.add_argument("--timeout", type=float, default=90.0, help="seconds for the EPP in the image to get ready")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="pyepp-image-check-"))
    ctr = subprocess.run(["buildah", "from", args.image], check=True, capture_output=True, text=True).stdout.strip()
    grpc_port, health_port, metrics_port, listener, admin = free_ports(5)
    epp: subprocess.Popen[bytes] | None = None
    try:
        with start_simulators(1, events=False, replay=False) as sims:
            sim = sims[0]
            confdir = work / "config"
            confdir.mkdir()
            (confdir / "epp.yaml").write_text(
                "endpoints:\n"
                f"  - {{name: sim0, address: 127.0.0.1, port: {sim.http_port}}}\n"
            )  # fmt: skip
            os.chmod(confdir, 0o755)
            os.chmod(confdir / "epp.yaml", 0o644)
            # `id -u` first: the process must run as the image's non-root user.
            argv = [
                "buildah", "run", "--isolation", "chroot", "--volume", f"{confdir}:/config:ro", ctr, "--",
                "sh", "-c", 'echo "uid=$(id -u)"; exec epp serve "$@"', "epp",
                "--config-file=/config/epp.yaml", "--bind-address=127.0.0.1", f"--grpc-port={grpc_port}",
                f"--grpc-health-port={health_port}", f"--metrics-port={metrics_port}", "--secure-serving=false",
                "--metrics-endpoint-auth=false",
            ]  # fmt: skip
            log_path = work / "epp.log"
            log = log_path.open("wb")
            epp = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            t0 = time.monotonic()
            while True:
                if epp.poll() is not None:
                    raise SystemExit(f"epp in the image exited with {epp.returncode}:\n{log_path.read_text()[-3000:]}")
                with contextlib.suppress(grpc.RpcError):
                    if health(health_port) == health_pb2.HealthCheckResponse.SERVING:
                        break
                if time.monotonic() - t0 > args.timeout:
                    raise SystemExit(f"epp in the image not SERVING after {args.timeout}s:\n{log_path.read_text()}")
                time.sleep(0.2)
            print(f"ok: gRPC health readiness SERVING after {time.monotonic() - t0:.1f} s")
            uid_line = next((ln for ln in log_path.read_text().splitlines() if ln.startswith("uid=")), "")
            if uid_line != "uid=10001":
                raise SystemExit(f"epp in the image runs as {uid_line!r}, want uid=10001")
            print("ok: runs as uid 10001")
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as r:
                text = r.read().decode()
            if "inference_extension_info" not in text:
                raise SystemExit("/metrics lacks inference_extension_info")
            print(f"ok: /metrics ({len(text)} bytes)")
            envoy = EnvoyProcess(EnvoyOptions(listener_port=listener, admin_port=admin, ext_proc_port=grpc_port), work)
            try:
                envoy.wait_ready()
                body = {"model": "Qwen/Qwen2.5-0.5B-Instruct", "prompt": "hello", "max_tokens": 2}
                r2 = post_json(envoy.url + "/v1/completions", body, timeout=60)
                if r2.status != 200 or int(r2.headers.get("x-inference-port", 0)) != sim.http_port:
                    raise SystemExit(f"request through Envoy: {r2.status} {r2.headers} {r2.body[:300]!r}")
                print(f"ok: request through Envoy → image EPP → simulator: {json.loads(r2.body)['usage']}")
            finally:
                envoy.stop()
    finally:
        if epp is not None and epp.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(epp.pid, signal.SIGTERM)
            try:
                epp.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(epp.pid, signal.SIGKILL)
                epp.wait(5)
        subprocess.run(["buildah", "rm", ctr], capture_output=True)
    size = subprocess.run(
        ["buildah", "images", "--format", "{{.Size}}", args.image], capture_output=True, text=True
    ).stdout.strip()
    print(f"image {args.image}: {size}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
