"""The event loop `epp serve` runs on (`--event-loop`): `auto` (the default: uvloop when it is installed, as it is
with the package, else asyncio's), asyncio's, or uvloop.

uvloop is the default because the EPP adds less latency and spends less CPU per request on it (measured through
Envoy with the variants in a random order: docs/benchmarks.md). Everything the EPP runs on the loop
(grpc.aio, aiohttp, pyzmq sockets and the KV-event reader, the scrapers' protocol, signal handlers, executors)
works on both.
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
