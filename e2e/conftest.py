"""Fixtures for real-process tests: `start_stack(...)` (see e2e/harness/stack.py) and a shared two-backend stack."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.harness.stack import Stack, start_stack


@pytest.fixture
def stack_factory(tmp_path: Path) -> Iterator[Callable[..., Stack]]:
    """`stack_factory(backends=2, mode=..., extra_config=..., subset_hints=...)`; all stacks closed at test end."""
    stacks: list[Stack] = []

    def make(**kwargs: Any) -> Stack:
        workdir = tmp_path / f"stack{len(stacks)}"
        workdir.mkdir()
        s = start_stack(workdir, **kwargs)
        stacks.append(s)
        return s

    yield make
    for s in stacks:
        s.close()
