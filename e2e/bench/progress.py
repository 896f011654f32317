"""Progress of a long run (the demo, the routing suite, the load benchmarks): which run, done / total, elapsed and
an estimate of what is left. On a terminal a tqdm bar; elsewhere (CI logs, a pipe) one line every `interval`
seconds and one at the end, so a log shows where a run is without a carriage-return mess."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from tqdm import tqdm


class Progress:
    """Call it with (done, total) as work completes (loadgen.run's `progress`)."""

    def __init__(
        self,
        label: str,
        total: int,
        unit: str = "requests",
        stream: TextIO | None = None,
        interval: float = 10.0,
        tty: bool | None = None,
    ) -> None:
        self.label, self.total, self.unit, self.interval = label, total, unit, interval
        self.stream = stream or sys.stderr
        self.start = self.last = time.monotonic()
        self.done = 0
        is_tty = self.stream.isatty() if tty is None else tty
        self.bar: tqdm[Any] | None = None
        if is_tty:
            self.bar = tqdm(
                total=total, desc=f"  {label}", unit=" " + unit, file=self.stream, dynamic_ncols=True, leave=True
            )

    def __call__(self, done: int, total: int) -> None:
        self.done, self.total = done, total
        if self.bar is not None:
            self.bar.total = total
            self.bar.update(done - self.bar.n)
            if done >= total:
                self.bar.close()
            return
        now = time.monotonic()
        if done >= total or now - self.last >= self.interval:
            self.last = now
            self.stream.write(self.line(now) + "\n")
            self.stream.flush()

    def line(self, now: float | None = None) -> str:
        elapsed = (time.monotonic() if now is None else now) - self.start
        if self.done >= self.total:
            return f"  {self.label}: {self.total}/{self.total} {self.unit} in {elapsed:.0f}s"
        left = f", ~{elapsed * (self.total - self.done) / self.done:.0f}s left" if self.done else ""
        return f"  {self.label}: {self.done}/{self.total} {self.unit}, {elapsed:.0f}s elapsed{left}"
