"""A real redis-server on a free loopback port, for the tests that share state through Redis."""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator

from e2e.harness.ports import free_ports


@contextlib.contextmanager
def redis_server(port: int = 0) -> Iterator[str]:
    """Start redis-server (no persistence) on `port` (0: a free one), yield its URL, stop it."""
    with redis_process(port) as (url, _):
        yield url


@contextlib.contextmanager
def redis_process(port: int = 0) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """`redis_server`, yielding the process too (fault tests kill, stop and continue it)."""
    exe = shutil.which("redis-server") or "/usr/bin/redis-server"
    port = port or free_ports(1)[0]
    proc = subprocess.Popen(
        [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0", proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)  # a stopped one cannot act on the terminate
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
