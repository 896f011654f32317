"""`--enable-pprof` (default true, as the anchors): profiling handlers under /debug/pprof/ on the metrics port.

- `/debug/pprof/profile?seconds=N&hz=H`: a CPU profile of every thread (the event loop included), sampled H times a
  second (default 100) for N seconds (default 30, as Go's; at most 300) by a background thread reading
  `sys._current_frames()`. The answer is folded stacks (`frame;frame;leaf count` per line), which flamegraph.pl,
  speedscope and inferno read. The event loop keeps serving while it runs.
- `/debug/pprof/goroutine` (alias `/debug/pprof/stacks`): every thread's stack and every asyncio task's, now.
- `/debug/pprof/heap?seconds=N`: the allocation sites that grew most over N seconds (default 10) by tracemalloc,
  which runs only while this request does.
"""

from __future__ import annotations

import asyncio
import collections
import sys
import threading
import time
import traceback
import tracemalloc
from types import FrameType

from aiohttp import web

MAX_SECONDS = 300.0
_INDEX = """/debug/pprof/
profile?seconds=30&hz=100  CPU profile (folded stacks) of all threads
goroutine                  stack dump of all threads and asyncio tasks
heap?seconds=10            allocation growth by site (tracemalloc)
"""


def _frame_label(frame: FrameType) -> str:
    code = frame.f_code
    return f"{code.co_qualname} ({code.co_filename.rsplit('/', 2)[-1]}:{code.co_firstlineno})"


def sample_stacks(seconds: float, hz: float) -> collections.Counter[str]:
    """Blocking: sample every other thread's stack `hz` times a second; run it in a thread of its own."""
    me = threading.get_ident()
    names = {t.ident: t.name for t in threading.enumerate()}
    counts: collections.Counter[str] = collections.Counter()
    period = 1.0 / hz
    deadline = time.monotonic() + seconds
    next_at = time.monotonic()
    while True:
        now = time.monotonic()
        if now >= deadline:
            break
        for ident, frame in sys._current_frames().items():
            if ident == me:
                continue
            stack: list[str] = []
            f: FrameType | None = frame
            while f is not None:
                stack.append(_frame_label(f))
                f = f.f_back
            stack.append(f"thread {names.get(ident, ident)}")
            counts[";".join(reversed(stack))] += 1
        next_at += period
        time.sleep(max(0.0, next_at - time.monotonic()))
    return counts


def _float_arg(request: web.Request, key: str, default: float, lo: float, hi: float) -> float:
    raw = request.query.get(key)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise web.HTTPBadRequest(text=f"{key}: expected a number, got {raw!r}\n") from None
    if not lo <= value <= hi:
        raise web.HTTPBadRequest(text=f"{key}: must be in [{lo:g}, {hi:g}], got {value:g}\n")
    return value


async def index(request: web.Request) -> web.Response:
    return web.Response(text=_INDEX)


async def profile(request: web.Request) -> web.Response:
    seconds = _float_arg(request, "seconds", 30.0, 0.01, MAX_SECONDS)
    hz = _float_arg(request, "hz", 100.0, 1.0, 1000.0)
    loop = asyncio.get_running_loop()
    counts = await loop.run_in_executor(None, sample_stacks, seconds, hz)
    body = "".join(f"{stack} {n}\n" for stack, n in counts.most_common())
    return web.Response(text=body, headers={"X-Profile-Samples": str(sum(counts.values()))})


async def goroutine(request: web.Request) -> web.Response:
    names = {t.ident: t.name for t in threading.enumerate()}
    out: list[str] = []
    for ident, frame in sys._current_frames().items():
        out.append(f"thread {names.get(ident, ident)} ({ident}):\n")
        out.extend(traceback.format_stack(frame))
        out.append("\n")
    for task in asyncio.all_tasks():
        out.append(f"task {task.get_name()}: {task.get_coro()!r}\n")
        for frame in task.get_stack():
            out.extend(traceback.format_stack(frame, limit=1))
        out.append("\n")
    return web.Response(text="".join(out))


_heap_lock = asyncio.Lock()


async def heap(request: web.Request) -> web.Response:
    seconds = _float_arg(request, "seconds", 10.0, 0.0, MAX_SECONDS)
    if _heap_lock.locked():
        raise web.HTTPConflict(text="a heap profile is already running\n")
    async with _heap_lock:
        started_here = not tracemalloc.is_tracing()
        if started_here:
            tracemalloc.start(16)
        try:
            before = tracemalloc.take_snapshot()
            await asyncio.sleep(seconds)
            after = tracemalloc.take_snapshot()
        finally:
            if started_here:
                tracemalloc.stop()
    stats = after.compare_to(before, "lineno")[:50]
    body = "".join(f"{s}\n" for s in stats)
    return web.Response(text=body)


def add_routes(app: web.Application) -> None:
    app.router.add_get("/debug/pprof/", index)
    app.router.add_get("/debug/pprof/profile", profile)
    app.router.add_get("/debug/pprof/goroutine", goroutine)
    app.router.add_get("/debug/pprof/stacks", goroutine)
    app.router.add_get("/debug/pprof/heap", heap)
