"""cost.pick_path times picks only: a stream answered with an error stops the run instead of counting as a pick."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from e2e.bench.cost.pick_path import messages, one, server_state


def test_a_pick_passes_and_an_error_answer_stops_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    state = server_state("random")
    wires = messages(64)
    asyncio.run(one(state, wires))

    def broken(*_: Any) -> Any:
        raise TypeError("bool object expected; got int")  # what a mistyped compiled module raised: a 500 a pick

    monkeypatch.setattr(state.director.scheduler, "schedule", broken)  # type: ignore[attr-defined]
    with pytest.raises(RuntimeError, match="without a pick"):
        asyncio.run(one(state, wires))
