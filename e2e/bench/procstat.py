"""Processes' CPU time from /proc (Linux), for the benchmarks' CPU-per-request and CPU-share columns."""

from __future__ import annotations

import os
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def proc_stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, user + system CPU seconds of all its threads), None if the process is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()  # after "pid (comm) "; fields[0] is the state
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICK


def cpu_seconds(pid: int, *, children: bool = False) -> float:
    """User + system CPU seconds of a live process (0 once it is gone) and, with `children`, of its live
    descendants."""
    if not children:
        st = proc_stat(pid)
        return st[1] if st else 0.0
    stats = {int(d): st for d in os.listdir("/proc") if d.isdigit() and (st := proc_stat(int(d))) is not None}
    kids: dict[int, list[int]] = {}
    for p, (ppid, _) in stats.items():
        kids.setdefault(ppid, []).append(p)
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        if p in stats:
            total += stats[p][1]
        todo.extend(kids.get(p, ()))
    return total
