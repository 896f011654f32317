"""The container's health probe command against a real gRPC health server."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def health_server() -> Iterator[tuple[int, health.HealthServicer]]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield port, servicer
    server.stop(0)


def probe(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "epp.healthcheck", *args], cwd=ROOT, capture_output=True, text=True, timeout=30
    )


def test_exit_code_follows_serving_status(health_server: tuple[int, health.HealthServicer]) -> None:
    port, servicer = health_server
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    servicer.set("inference-extension", health_pb2.HealthCheckResponse.NOT_SERVING)
    assert probe("--port", str(port)).returncode == 0
    r = probe("--port", str(port), "--service", "inference-extension")
    assert r.returncode == 1 and "NOT_SERVING" in r.stderr
    servicer.set("inference-extension", health_pb2.HealthCheckResponse.SERVING)
    assert probe("--port", str(port), "--service", "inference-extension").returncode == 0
    r = probe("--port", str(port), "--service", "nope")
    assert r.returncode == 1 and "NOT_FOUND" in r.stderr


def test_unreachable_server_fails_fast() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    r = probe("--port", str(port), "--timeout", "1")
    assert r.returncode == 1 and "UNAVAILABLE" in r.stderr
    assert time.monotonic() - t0 < 15
