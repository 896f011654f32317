"""The event loop `epp serve` runs on: uvloop when it is installed (the default, `--event-loop auto`), else asyncio's.

Why: nearly all of the EPP's CPU per request outside the scheduling chain is event-loop work (grpc.aio's
completion callbacks, the metrics scrapes' sockets and timers). With uvloop the EPP process used ~30% less CPU per
request through Envoy and served more picks per second (docs/benchmarks.md, "Event loop and transport" under issue
#16). Everything the EPP runs on the loop (grpc.aio, aiohttp, pyzmq's asyncio sockets, signal handlers, executors)
works on both; `--event-loop asyncio` keeps the standard loop.
"""

from __future__ import annotations

import asyncio
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


def run(main: Coroutine[Any, Any, T], factory: Callable[[], asyncio.AbstractEventLoop] | None) -> T:
    """`asyncio.run(main)` on a loop from `factory` (None: asyncio's default loop)."""
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)
