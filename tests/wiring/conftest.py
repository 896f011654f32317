"""An in-process simulated vLLM server (its /tokenize is the model server's tokenizer)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from e2e.sim.launch import ThreadSim, start_in_thread


@pytest.fixture
def thread_sim() -> Iterator[ThreadSim]:
    sim = start_in_thread(events=False)
    yield sim
    sim.stop()
