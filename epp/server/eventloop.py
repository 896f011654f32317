"""The event loop `epp serve` runs on (`--event-loop`): asyncio's (the default), uvloop, or `auto` (uvloop when it
is installed, else asyncio's).

uvloop is not the default because it did not win where it counts (docs/benchmarks.md, issue #16, helper overhead2):
through Envoy the EPP's CPU per request was within 3% of asyncio's and picks/s within the run-to-run noise; most
of the EPP's CPU per request is grpc.aio's transport (C-core and its Cython callbacks, not the loop's Python code)
and the metrics scrapes' parsing. Everything the EPP runs on the loop (grpc.aio, aiohttp, pyzmq's asyncio
sockets, the scrapers' protocol, signal handlers, executors) works on both.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
EVENT_LOOPS = ("auto", "asyncio", "uvloop")


def loop_factory(choice: str) -> tuple[str, Callable[[], asyncio.AbstractEventLoop] | None]:
    """(the loop's name, its factory; None for asyncio's default). `uvloop` when it is not installed raises
    RuntimeError; `auto` falls back to asyncio."""
    if choice not in EVENT_LOOPS:
        raise ValueError(f"event loop must be one of {', '.join(EVENT_LOOPS)}, got {choice!r}")
    if choice == "asyncio":
        return "asyncio", None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise RuntimeError("--event-loop uvloop: uvloop is not installed (pip install uvloop)") from None
        return "asyncio", None
    return "uvloop", uvloop.new_event_loop


def set_switch_interval(seconds: float) -> float:
    """`--gil-switch-interval`: sys.setswitchinterval when > 0 (0 keeps Python's); returns the interval in force."""
    if seconds > 0:
        sys.setswitchinterval(seconds)
    return sys.getswitchinterval()


def run(main: Coroutine[Any, Any, T], factory: Callable[[], asyncio.AbstractEventLoop] | None) -> T:
    """`asyncio.run(main)` on a loop from `factory` (None: asyncio's default loop)."""
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)
