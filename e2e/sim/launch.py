"""Start simulator subprocesses for tests, demos and benchmarks.

    from e2e.sim.launch import start_simulators

    with start_simulators(3, base_args=["--max-num-seqs", "4"], events=True, replay=True) as sims:
        for s in sims:
            s.url            # "http://127.0.0.1:PORT"
            s.hostport       # "127.0.0.1:PORT" (the endpoint name the EPP sees; also in the event topic)
            s.event_endpoint  # "tcp://127.0.0.1:EPORT" (SUB connects here), None if events=False
            s.replay_endpoint # "tcp://127.0.0.1:RPORT" (DEALER connects here), None if replay=False
            s.topic          # "kv@127.0.0.1:PORT@Qwen/Qwen2.5-0.5B-Instruct"
            s.event_endpoints # one per data-parallel rank (--data-parallel-size N), rank 0 first
    # all processes are stopped (SIGTERM, then SIGKILL) on exit

Each simulator binds port 0 for HTTP and, with `events=True`, `tcp://*:0` for its PUB (and ROUTER), so
nothing races for ports; the bound ports come from the one JSON line the simulator prints when ready.
`start_simulators` then waits for `/health` (pass `wait_healthy=False` for `--startup-delay` tests).
`start_simulators(n, distinct_hosts=True)` gives simulator i its own loopback IP (127.0.0.2, 127.0.0.3, ...)
and all of them the same http / event / replay port numbers, like pods: events at `tcp://<ip>:<event_port>`,
topic `kv@<ip>:<http_port>@<model>` (the PUB binds that IP via `--kv-events-bind`).
`start_in_thread(args)` runs a simulator inside the calling process (its own event loop in a thread,
the tokenizer shared across them): same attributes, much faster to start, for tests that do not need
a separate process (no `/admin/crash`, no kill). `per_sim_args(i)` adds arguments for simulator i
(e.g. different latency). `connect_events="tcp://host:port"`
makes every simulator's PUB connect to one central SUB instead of binding (llm-d's centralized mode);
then `event_endpoint` is that address. `start_simulator(...)` starts one. `SimProcess.stop()` is
idempotent; `SimProcess.kill()` simulates a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
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


class _Addresses:
    host: str
    http_port: int
    event_endpoint: str | None
    replay_endpoint: str | None

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


@dataclass
class SimProcess(_Addresses):
    proc: subprocess.Popen[str]
    http_port: int
    event_endpoint: str | None
    replay_endpoint: str | None
    topic: str
    host: str = "127.0.0.1"
    stderr_lines: list[str] = field(default_factory=list)
    event_endpoints: list[str] = field(default_factory=list)  # one per data-parallel rank
    replay_endpoints: list[str] = field(default_factory=list)

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


def loopback_hosts(n: int, first: int = 2) -> list[str]:
    """n distinct loopback addresses (127.0.0.2, 127.0.0.3, ...): one "pod IP" per simulator."""
    return [f"127.0.{(first + i) // 256}.{(first + i) % 256}" for i in range(n)]


def common_free_ports(hosts: Sequence[str], k: int) -> list[int]:
    """k ports that are free on every host (pods share port numbers, as in Kubernetes)."""
    import random
    import socket

    rng = random.Random()
    for _ in range(200):
        ports = rng.sample(range(20000, 60000), k)
        socks: list[socket.socket] = []
        try:
            for h in hosts:
                for p in ports:
                    s = socket.socket()
                    socks.append(s)
                    s.bind((h, p))
            return ports
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no common free ports")


def _event_args(
    host: str, events: bool, replay: bool, connect_events: str | None, event_port: int, replay_port: int
) -> list[str]:
    if not (events or connect_events):
        return []
    if connect_events:
        args = ["--kv-events-endpoint", connect_events]
    elif host == "127.0.0.1" and event_port == 0:
        args = ["--kv-events-endpoint", "tcp://*:0"]
    else:
        args = ["--kv-events-endpoint", f"tcp://{host}:{event_port}", "--kv-events-bind"]
    if replay:
        args += ["--kv-events-replay-endpoint", f"tcp://{host}:{replay_port}" if host != "127.0.0.1" else "tcp://*:0"]
    return args


# A simulator imports transformers and loads a tokenizer: ~2 s on an idle box, over a minute on a shared box at
# load average 25+. Generous, because a start that fails only wastes the run.
SIM_START_TIMEOUT = 180.0


def start_simulator(
    args: Sequence[str] = (),
    *,
    events: bool = True,
    replay: bool = True,
    connect_events: str | None = None,
    wait_healthy: bool = True,
    timeout: float = SIM_START_TIMEOUT,
    env: dict[str, str] | None = None,
    host: str = "127.0.0.1",
    http_port: int = 0,
    event_port: int = 0,
    replay_port: int = 0,
) -> SimProcess:
    """One simulator process. `host` is its "pod IP" (HTTP, events and the topic use it); ports 0 = any free."""
    cmd = [sys.executable, "-m", "e2e.sim", "--port", str(http_port), "--host", host, "--pod-ip", host, *args]
    cmd += _event_args(host, events, replay, connect_events, event_port, replay_port)
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
        event_endpoint=connect_events or _localize(_str(ready["kv_events_endpoint"]), host),
        replay_endpoint=_localize(_str(ready["kv_events_replay_endpoint"]), host),
        topic=str(ready["topic"]),
        host=host,
        stderr_lines=stderr_lines,
        event_endpoints=[e for e in (_localize(x, host) for x in ready["kv_events_endpoints"]) if e],
        replay_endpoints=[e for e in (_localize(x, host) for x in ready["kv_events_replay_endpoints"]) if e],
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
    timeout: float = SIM_START_TIMEOUT,
    distinct_hosts: bool = False,
) -> Iterator[list[SimProcess]]:
    """Start n simulators (in parallel), yield them, stop them all on exit.

    `distinct_hosts=True` gives each its own loopback IP (`loopback_hosts`) with the SAME http / event /
    replay ports, like pods in a cluster: the EPP can reach events at `tcp://<ip>:<event_port>`."""
    hosts = loopback_hosts(n) if distinct_hosts else ["127.0.0.1"] * n
    ports = common_free_ports(hosts, 3) if distinct_hosts else [0, 0, 0]
    slots: list[SimProcess | None] = [None] * n
    errors: list[BaseException] = []

    def one(i: int) -> None:
        args = [*base_args, *(per_sim_args(i) if per_sim_args else ())]
        try:
            s = start_simulator(
                args,
                events=events,
                replay=replay,
                connect_events=connect_events,
                wait_healthy=False,
                timeout=timeout,
                host=hosts[i],
                http_port=ports[0],
                event_port=ports[1],
                replay_port=ports[2],
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


class ThreadSim(_Addresses):
    """A simulator served from a background thread of this process (same surface as SimProcess)."""

    def __init__(self, args: Sequence[str], connect_events: str | None, events: bool, replay: bool) -> None:
        from e2e.sim.config import parse_args
        from e2e.sim.server import RunningSim, start_server
        from e2e.sim.tokenizer import shared_tokenizer

        argv = ["--port", "0", "--host", "127.0.0.1", "--pod-ip", "127.0.0.1", *args]
        if events or connect_events:
            argv += ["--kv-events-endpoint", connect_events or "tcp://*:0"]
            if replay:
                argv += ["--kv-events-replay-endpoint", "tcp://*:0"]
        cfg = parse_args(argv)
        tok = shared_tokenizer()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="sim")
        self._thread.start()
        fut = asyncio.run_coroutine_threadsafe(start_server(cfg, tok, allow_crash=False), self.loop)
        self.running: RunningSim = fut.result(30)
        info = self.running.ready_info()
        self.host = "127.0.0.1"
        self.http_port = int(info["http_port"])
        self.event_endpoint = connect_events or _localize(info["kv_events_endpoint"], self.host)
        self.replay_endpoint = _localize(info["kv_events_replay_endpoint"], self.host)
        self.topic = str(info["topic"])
        self.event_endpoints = [e for e in (_localize(x, self.host) for x in info["kv_events_endpoints"]) if e]
        self.replay_endpoints = [e for e in (_localize(x, self.host) for x in info["kv_events_replay_endpoints"]) if e]
        self._stopped = False

    def alive(self) -> bool:
        return not self._stopped

    def wait_healthy(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
            time.sleep(0.05)
        raise TimeoutError(f"simulator {self.url} not healthy after {timeout}s")

    def stop(self, timeout: float = 5.0) -> None:
        if self._stopped:
            return
        self._stopped = True
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self.running.close(), self.loop).result(timeout)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)
        self.loop.close()


def start_in_thread(
    args: Sequence[str] = (),
    *,
    events: bool = True,
    replay: bool = True,
    connect_events: str | None = None,
    wait_healthy: bool = True,
) -> ThreadSim:
    sim = ThreadSim(args, connect_events, events, replay)
    if wait_healthy:
        sim.wait_healthy()
    return sim


Sim = SimProcess | ThreadSim


USAGE = """usage: python -m e2e.sim.launch N [simulator flags...]

Start N simulated vLLM servers (subprocesses of `python -m e2e.sim`) on free ports, KV events and replay on;
print one JSON line per server ({"url", "events", "replay", "topic"}) once all are healthy, and run until Ctrl-C
or SIGTERM, which stop them all. The flags are the simulator's, for every server:
"""


def main(argv: list[str] | None = None) -> int:
    """`python -m e2e.sim.launch N [simulator flags...]`: start N simulators, print one JSON line each, wait."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] in (["-h"], ["--help"]):
        from e2e.sim.config import build_parser

        print(USAGE + "\n" + build_parser().format_help().split("\n\n", 1)[-1])
        return 0
    if not args or not args[0].isdigit():
        print(USAGE.split("\n\n")[0] + "\n(--help: what it does and the simulator flags)", file=sys.stderr)
        return 2

    def interrupt(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, interrupt)  # stop the servers as Ctrl-C does (the `with` below)
    with contextlib.suppress(KeyboardInterrupt), start_simulators(int(args[0]), base_args=args[1:]) as sims:
        for s in sims:
            info = {"url": s.url, "events": s.event_endpoint, "replay": s.replay_endpoint, "topic": s.topic}
            print(json.dumps(info), flush=True)
        while True:
            time.sleep(3600)
    return 0


if __name__ == "__main__":
    sys.exit(main())
