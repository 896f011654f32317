"""Pytest fixtures around the launcher. Use from a root conftest with `pytest_plugins = ["e2e.sim.fixtures"]`,
or import the names into a conftest.

- `sim_factory`: `sim_factory(*args, events=True, replay=True, wait_healthy=True) -> SimProcess`; every
  simulator it started is stopped when the test ends.
- `thread_sim_factory`: the same, but simulators run inside the test process (`start_in_thread`): starts in
  milliseconds; use it unless the test needs a real process (crash, kill, process-wide state).
- `sim`: one default in-process simulator (events + replay on) for the test.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from e2e.sim.launch import SimProcess, ThreadSim, start_in_thread, start_simulator

SimFactory = Callable[..., SimProcess]


@pytest.fixture
def sim_factory() -> Iterator[SimFactory]:
    started: list[SimProcess] = []

    def make(*args: str, **kw: Any) -> SimProcess:
        s = start_simulator(list(args), **kw)
        started.append(s)
        return s

    yield make
    for s in started:
        s.stop()


@pytest.fixture
def thread_sim_factory() -> Iterator[Callable[..., ThreadSim]]:
    started: list[ThreadSim] = []

    def make(*args: str, **kw: Any) -> ThreadSim:
        s = start_in_thread(list(args), **kw)
        started.append(s)
        return s

    yield make
    for s in started:
        s.stop()


@pytest.fixture
def sim(thread_sim_factory: Callable[..., ThreadSim]) -> ThreadSim:
    return thread_sim_factory()
