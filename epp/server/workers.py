"""`epp serve --workers N`: N EPP processes sharing the ext_proc and health ports through SO_REUSEPORT.

One Python process is bound by the GIL to about one core. Each worker is a full EPP (its own
discovery, scrapers and KV-event subscriptions, so every worker scores with the same state); the
kernel spreads Envoy's connections over them. Worker i serves metrics on `--metrics-port + i`.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Sequence
from types import FrameType


def worker_argv(argv: Sequence[str], index: int) -> list[str]:
    """The child's command line: the parent's `serve` arguments without --workers, plus --worker-index."""
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
    return [sys.executable, "-m", "epp", *out, "--worker-index", str(index)]


def run_workers(argv: Sequence[str], n: int) -> int:
    """Start n workers, forward SIGTERM/SIGINT to them, and return the worst exit code."""
    children = [subprocess.Popen(worker_argv(argv, i)) for i in range(n)]

    def forward(signum: int, _frame: FrameType | None) -> None:
        for c in children:
            if c.poll() is None:
                c.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    codes = [c.wait() for c in children]
    return max(codes, default=0)
