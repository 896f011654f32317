"""`epp serve --workers 2`: two full EPPs share the ext_proc and health ports (SO_REUSEPORT)."""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path

import pytest

from e2e.harness.ports import free_port_run, free_ports
from e2e.harness.procs import EppPorts, EppProcess
from epp.server.workers import worker_argv

pytestmark = pytest.mark.e2e


def _metrics(port: int, timeout: float = 60.0) -> str:
    """The page, once the worker serving it is up: each worker imports and starts on its own, and on a loaded
    2-core box the second can come up more than 10 s after the first is ready (a clean-clone CI run, 2026-12-04)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                return str(r.read().decode())
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_worker_argv_drops_workers_flag() -> None:
    argv = worker_argv(["serve", "--config", "c.yaml", "--workers", "3", "--workers=3", "--grpc-port", "1"], 2)
    assert argv[1:] == ["-m", "epp", "serve", "--config", "c.yaml", "--grpc-port", "1", "--worker-index", "2"]


def test_free_port_run_hands_out_disjoint_runs_below_the_ephemeral_range() -> None:
    """Consecutive ports for `--workers`' metrics: never inside the range outgoing connections take ports from,
    never the same run twice in a process (a bench starts many EPPs), and many more runs than one bench needs."""
    import socket

    from e2e.harness.ports import _ephemeral_low

    low, taken = _ephemeral_low(), set[int]()
    for _ in range(200):
        base = free_port_run(3)
        run = {base, base + 1, base + 2}
        assert max(run) < low and not taken & run
        taken |= run
    socks = [socket.socket() for _ in range(3)]
    try:
        for i, s in enumerate(socks):
            s.bind(("127.0.0.1", base + i))
    finally:
        for s in socks:
            s.close()


def test_two_workers_share_ports_and_each_serves_metrics(tmp_path: Path) -> None:
    cfg = tmp_path / "epp.yaml"
    # a light chain (no tokenizer to load in each worker): this is about the processes and their ports
    cfg.write_text("plugins: [{type: queue-scorer}]\nendpoints:\n- {address: 127.0.0.1, port: 9}\n")
    grpc_port, health = free_ports(2)
    metrics = free_port_run(2)  # worker i serves metrics on metrics + i: both must be free
    epp = EppProcess(cfg, tmp_path, EppPorts(grpc_port, health, metrics), extra_args=["--workers", "2"])
    try:
        epp.wait_ready()
        # worker i serves metrics on --metrics-port + i; both are whole EPPs with the pool in their datastore
        for port in (metrics, metrics + 1):
            assert 'inference_pool_ready_pods{name="default"}' in _metrics(port)
    finally:
        epp.stop()
    assert not epp.running()
