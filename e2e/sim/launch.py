"""Start simulator subprocesses for tests, demos and benchmarks.

    from e2e.sim.launch import start_simulators

    with start_simulators(3, base_args=["--max-num-seqs", "4"], events=True, replay=True) as sims:
        for s in sims:
            s.url            # "http://127.0.0.1:PORT"
            s.hostport       # "127.0.0.1:PORT" (the endpoint name the EPP sees; also in the event topic)
            s.event_endpoint  # "tcp://127.0.0.1:EPORT" (SUB connects here), None if events=False
            s.replay_endpoint # "tcp://127.0.0.1:RPORT" (DEALER connects here), None if replay=False
            s.topic          # "kv@127.0.0.1:PORT@Qwen/Qwen2.5-0.5B-Instruct"
    # all processes are stopped (SIGTERM, then SIGKILL) on exit

Each simulator binds port 0 for HTTP and, with `events=True`, `tcp://*:0` for its PUB (and ROUTER), so
nothing races for ports; the bound ports come from the one JSON line the simulator prints when ready.
`start_simulators` then waits for `/health` (pass `wait_healthy=False` for `--startup-delay` tests).
`per_sim_args(i)` adds arguments for simulator i (e.g. different latency). `connect_events="tcp://host:port"`
makes every simulator's PUB connect to one central SUB instead of binding (llm-d's centralized mode);
then `event_endpoint` is that address. `start_simulator(...)` starts one. `SimProcess.stop()` is
idempotent; `SimProcess.kill()` simulates a crash.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class SimProcess:
    proc: subprocess.Popen[str]
    http_port: int
    event_endpoint: str | None
    replay_endpoint: str | None
    topic: str
    host: str = "127.0.0.1"
    stderr_lines: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.http_port}"

    @property
    def hostport(self) -> str:
        return f"{self.host}:{self.http_port}"

    @property
    def event_port(self) -> int | None:
        return int(self.event_endpoint.rpartition(":")[2]) if self.event_endpoint else None

    @property
    def replay_port(self) -> int | None:
        return int(self.replay_endpoint.rpartition(":")[2]) if self.replay_endpoint else None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 5.0) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                with contextlib.suppress(Exception):
                    stream.close()

    def kill(self) -> None:
        """SIGKILL: a crashed model server."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def wait_healthy(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"simulator exited with {self.proc.returncode}: {''.join(self.stderr_lines[-20:])}")
            with contextlib.suppress(OSError), urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
            time.sleep(0.05)
        raise TimeoutError(f"simulator {self.url} not healthy after {timeout}s")


def _localize(endpoint: str | None, host: str) -> str | None:
    """`tcp://*:P` (what the simulator bound) → `tcp://127.0.0.1:P` (what a client connects to)."""
    if endpoint is None:
        return None
    return endpoint.replace("tcp://*:", f"tcp://{host}:")


def start_simulator(
    args: Sequence[str] = (),
    *,
    events: bool = True,
    replay: bool = True,
    connect_events: str | None = None,
    wait_healthy: bool = True,
    timeout: float = 60.0,
    env: dict[str, str] | None = None,
) -> SimProcess:
    cmd = [sys.executable, "-m", "e2e.sim", "--port", "0", "--host", "127.0.0.1", "--pod-ip", "127.0.0.1", *args]
    if events or connect_events:
        cmd += ["--kv-events-endpoint", connect_events or "tcp://*:0"]
        if replay:
            cmd += ["--kv-events-replay-endpoint", "tcp://*:0"]
    proc = subprocess.Popen(
        cmd,
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    stderr_lines: list[str] = []

    def drain() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            stderr_lines.append(line)
            if len(stderr_lines) > 500:
                del stderr_lines[:100]

    threading.Thread(target=drain, daemon=True).start()
    ready = _read_ready(proc, timeout, stderr_lines)
    sim = SimProcess(
        proc=proc,
        http_port=int(ready["http_port"]),
        event_endpoint=connect_events or _localize(_str(ready["kv_events_endpoint"]), "127.0.0.1"),
        replay_endpoint=_localize(_str(ready["kv_events_replay_endpoint"]), "127.0.0.1"),
        topic=str(ready["topic"]),
        stderr_lines=stderr_lines,
    )
    if wait_healthy:
        try:
            sim.wait_healthy(timeout)
        except BaseException:
            sim.stop()
            raise
    return sim


def _str(v: object) -> str | None:
    return None if v is None else str(v)


def _read_ready(proc: subprocess.Popen[str], timeout: float, stderr_lines: list[str]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    done = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            with contextlib.suppress(json.JSONDecodeError):
                msg = json.loads(line)
                if isinstance(msg, dict) and msg.get("event") == "ready":
                    result.update(msg)
                    done.set()
        done.set()

    threading.Thread(target=read, daemon=True).start()
    if not done.wait(timeout) or not result:
        proc.kill()
        proc.wait()
        raise RuntimeError(f"simulator did not start: {''.join(stderr_lines[-20:])}")
    return result


@contextlib.contextmanager
def start_simulators(
    n: int,
    *,
    base_args: Sequence[str] = (),
    per_sim_args: Callable[[int], Sequence[str]] | None = None,
    events: bool = True,
    replay: bool = True,
    connect_events: str | None = None,
    wait_healthy: bool = True,
    timeout: float = 60.0,
) -> Iterator[list[SimProcess]]:
    """Start n simulators (in parallel), yield them, stop them all on exit."""
    slots: list[SimProcess | None] = [None] * n
    errors: list[BaseException] = []

    def one(i: int) -> None:
        args = [*base_args, *(per_sim_args(i) if per_sim_args else ())]
        try:
            s = start_simulator(
                args, events=events, replay=replay, connect_events=connect_events, wait_healthy=False, timeout=timeout
            )
            slots[i] = s
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sims = [s for s in slots if s is not None]
    try:
        if errors:
            raise errors[0]
        if wait_healthy:
            for s in sims:
                s.wait_healthy(timeout)
        yield sims
    finally:
        for s in sims:
            s.stop()
