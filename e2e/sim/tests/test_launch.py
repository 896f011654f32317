"""The subprocess launcher (`python -m e2e.sim` processes), as the demo, benchmarks and e2e tests use it."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys

from e2e.sim.launch import start_simulators
from e2e.sim.testing import EventSubscriber

from .helpers import get, post


def test_start_simulators_on_distinct_hosts_with_pod_like_ports() -> None:
    with start_simulators(2, distinct_hosts=True, per_sim_args=lambda i: ["--max-num-seqs", str(3 + i)]) as sims:
        a, b = sims
        assert a.host != b.host and a.host.startswith("127.")
        assert a.http_port == b.http_port and a.event_port == b.event_port and a.replay_port == b.replay_port
        for i, s in enumerate(sims):
            assert s.alive() and get(s.url + "/health")[0] == 200
            _, state = post(s.url + "/admin/config", {})
            assert state["config"]["max_num_seqs"] == 3 + i
            assert s.event_endpoint == f"tcp://{s.host}:{s.event_port}"
            assert s.topic == f"kv@{s.host}:{s.http_port}@Qwen/Qwen2.5-0.5B-Instruct"
            sub = EventSubscriber(s.event_endpoint)
            try:
                status, _ = post(s.url + "/v1/completions", {"prompt": "hello " * 40, "max_tokens": 1})
                assert status == 200
                assert sub.recv().topic == s.topic.encode()
            finally:
                sub.close()
        procs = [s.proc for s in sims]
    assert all(p.poll() is not None for p in procs)


def _port_open(url: str) -> bool:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex((host, int(port))) == 0


def test_launch_cli_stops_its_simulators_on_sigterm() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "e2e.sim.launch", "2", "--max-num-seqs", "2"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        urls = [json.loads(proc.stdout.readline())["url"] for _ in range(2)]
        assert all(get(u + "/health")[0] == 200 for u in urls)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        assert not any(_port_open(u) for u in urls)  # the simulators are gone with it
    finally:
        if proc.poll() is None:
            proc.kill()


def test_launch_cli_help_explains_itself_and_lists_the_simulator_flags() -> None:
    r = subprocess.run([sys.executable, "-m", "e2e.sim.launch", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0
    assert "SIGTERM" in r.stdout and "--max-num-seqs" in r.stdout and "--kv-events-endpoint" in r.stdout
    bad = subprocess.run([sys.executable, "-m", "e2e.sim.launch"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "usage:" in bad.stderr
