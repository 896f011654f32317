"""`epp serve --workers N`: N EPP processes sharing the ext_proc and health ports through SO_REUSEPORT.

One Python process is bound by the GIL to about one core. The kernel spreads the gateway's connections over the
workers. What one worker books at a pick (its in-flight load, the speculative prefix entries, prefill-cost
bookings) reaches the others through a relay in this parent process, on a Unix socket (the workers'
worker-state-syncer), so the next pick in any worker sees it. Each worker runs its own discovery, but only worker 0
scrapes the pods and subscribes to their KV events: it publishes what it gets on the workers' feed (ZMQ on ipc://
in this process's private directory) and the others apply that as their own (epp.wiring.feed). A worker that dies
is restarted (one that dies within `STARTUP_GRACE` of its start stops them all: a bad flag or config would only
crash again); SIGTERM/SIGINT go to every worker, which drain as one EPP does. Worker i serves metrics on
`--metrics-port + i`.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from types import FrameType

from epp.datalayer.plugins.worker_state_syncer import frame, read_frame

STARTUP_GRACE = 10.0  # seconds: a worker that exits sooner is not restarted
MAX_BUFFERED = 8 << 20  # bytes waiting for one slow worker; frames for it are dropped beyond


def worker_argv(argv: Sequence[str], index: int, socket_path: str = "", feed: str = "") -> list[str]:
    """The child's command line: the parent's `serve` arguments without --workers, plus --worker-index (and the
    relay's socket, and the feed's address)."""
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == "--workers":
            skip = True
            continue
        if a.startswith("--workers="):
            continue
        out.append(a)
    extra = ["--worker-state-socket", socket_path] if socket_path else []
    if feed:
        extra += ["--worker-feed", feed]
    return [sys.executable, "-m", "epp", *out, "--worker-index", str(index), *extra]


async def relay(path: str, started: threading.Event | None = None) -> None:
    """Hand every frame a worker sends to every other worker connected (best effort: a worker that does not read
    loses frames rather than holding the others back)."""
    clients: set[asyncio.StreamWriter] = set()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        clients.add(writer)
        try:
            while True:
                out = frame(await read_frame(reader))
                for w in clients:
                    if w is not writer and w.transport.get_write_buffer_size() < MAX_BUFFERED:
                        w.write(out)
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            pass
        finally:
            clients.discard(writer)
            writer.close()

    server = await asyncio.start_unix_server(serve, path)
    if started is not None:
        started.set()
    try:
        async with server:
            await server.serve_forever()
    finally:
        for w in list(clients):  # the workers notice and reconnect
            w.close()


def start_relay(path: str) -> threading.Thread:
    started = threading.Event()
    thread = threading.Thread(target=lambda: asyncio.run(relay(path, started)), name="worker-relay", daemon=True)
    thread.start()
    if not started.wait(10):
        raise RuntimeError(f"the workers' relay did not start on {path}")
    return thread


def run_workers(argv: Sequence[str], n: int) -> int:
    """Start n workers and the relay between them, restart a worker that dies, forward SIGTERM/SIGINT to all, and
    return the worst exit code."""
    with tempfile.TemporaryDirectory(prefix="epp-workers-") as tmp:
        sock = os.path.join(tmp, "state.sock")
        feed = "ipc://" + os.path.join(tmp, "feed.ipc")  # worker 0 binds it (epp.wiring.feed)
        start_relay(sock)
        started = [0.0] * n
        children: list[subprocess.Popen[bytes]] = []

        def spawn(i: int) -> subprocess.Popen[bytes]:
            started[i] = time.monotonic()
            return subprocess.Popen(worker_argv(argv, i, sock, feed))

        children.extend(spawn(i) for i in range(n))
        stopping: list[int] = []

        def forward(signum: int, _frame: FrameType | None) -> None:
            stopping.append(signum)
            for c in children:
                if c.poll() is None:
                    c.send_signal(signum)

        signal.signal(signal.SIGTERM, forward)
        signal.signal(signal.SIGINT, forward)
        while True:
            for i, c in enumerate(children):
                code = c.poll()
                if code is None or stopping:
                    continue
                if time.monotonic() - started[i] < STARTUP_GRACE:
                    print(f"epp: worker {i} exited with {code} while starting; stopping", file=sys.stderr)
                    forward(signal.SIGTERM, None)
                    break
                print(f"epp: worker {i} exited with {code}; restarting it", file=sys.stderr)
                children[i] = spawn(i)
            if all(c.poll() is not None for c in children):
                return max((c.returncode for c in children), default=0)
            time.sleep(0.1)
