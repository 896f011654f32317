"""Fixtures for the KV-cache tests: vLLM's real publisher, free ports, a real redis-server."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.vllm_interop import load_kv_events


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def vllm_kv() -> types.ModuleType:
    kv = load_kv_events()
    # vllm.config.kv_events is only a name in the torch-free loader; the publisher builds one to report
    # its own config, so give it a plain record type.
    kv.KVEventsConfig = types.SimpleNamespace  # type: ignore[attr-defined]
    return kv


class Publishers:
    """Start vLLM ZmqEventPublishers (PUB bound on ipc, ROUTER replay on 127.0.0.1) and shut them down."""

    def __init__(self, kv: types.ModuleType, tmp: Path) -> None:
        self.kv = kv
        self.tmp = tmp
        self.live: list[Any] = []
        self.n = 0

    def start(self, topic: str = "", endpoint: str | None = None, replay: str | None = None, rank: int = 0) -> Any:
        self.n += 1
        endpoint = endpoint or f"ipc://{self.tmp}/pub{self.n}"
        replay = replay or f"tcp://127.0.0.1:{free_port()}"
        p = self.kv.ZmqEventPublisher(rank, endpoint=endpoint, replay_endpoint=replay, topic=topic)
        p.endpoint, p.replay = endpoint, replay
        self.live.append(p)
        return p

    def stop(self, p: Any) -> None:
        p.shutdown()
        self.live.remove(p)

    def close(self) -> None:
        for p in list(self.live):
            self.stop(p)


@pytest.fixture
def publishers(vllm_kv: types.ModuleType, tmp_path: Path) -> Iterator[Publishers]:
    pubs = Publishers(vllm_kv, tmp_path)
    yield pubs
    pubs.close()


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    exe = shutil.which("redis-server") or "/usr/bin/redis-server"
    port = free_port()
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
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
