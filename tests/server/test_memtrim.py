"""MemoryTrimmer: malloc_trim found and called (a stream's debounced request after a large body is tested in
stages/test_response.py)."""

from __future__ import annotations

from epp.server.memtrim import MemoryTrimmer


def test_malloc_trim_is_found_on_glibc() -> None:
    t = MemoryTrimmer()
    assert t.available
    t.trim_now()
    assert t.trims == 1
