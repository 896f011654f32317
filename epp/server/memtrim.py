"""Give the heap's free pages back to the OS after large request bodies (glibc `malloc_trim`).

A large body passes through many allocations below glibc's mmap threshold (the gRPC chunks it arrived in, the
strings parsed out of it); once freed they stay in the process's heaps and arenas, counted in its RSS.
`malloc_trim(0)` returns every free page of every arena.
It runs on a worker thread (it can take milliseconds on a large heap), at most once per `delay` seconds and only
after a stream that carried a large body ended. Without glibc (musl, macOS) this does nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

# A stream whose request body reached this many bytes asks for a trim when it ends.
TRIM_AFTER_BODY_BYTES = 4 * 1024 * 1024


def _load_malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        fn = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


class MemoryTrimmer:
    """Debounced `malloc_trim(0)`: `request()` from the event loop; the trim follows `delay` seconds later."""

    def __init__(self, delay: float = 1.0, trim: Callable[[int], int] | None = None) -> None:
        self.delay = delay
        self._trim = trim if trim is not None else _load_malloc_trim()
        self._pending: asyncio.TimerHandle | None = None
        self.trims = 0  # trims done (tests, logs)

    @property
    def available(self) -> bool:
        return self._trim is not None

    def request(self) -> None:
        if self._trim is None or self._pending is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._pending = loop.call_later(self.delay, self._start, loop)

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._pending = None
        loop.run_in_executor(None, self.trim_now)

    def trim_now(self) -> None:
        assert self._trim is not None
        try:
            self._trim(0)
        except Exception:  # never let a trim failure surface in a request
            log.exception("malloc_trim failed")
            return
        self.trims += 1
