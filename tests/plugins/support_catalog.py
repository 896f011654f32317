"""Helpers shared by the llm-d-router catalog filter and scorer tests."""

from __future__ import annotations

import time

from epp.framework import (
    ApiKind,
    CycleState,
    Endpoint,
    InferenceRequest,
    Metrics,
)

S = CycleState()


def req(headers: dict[str, str] | None = None) -> InferenceRequest:
    return InferenceRequest("r", "/v1/completions", ApiKind.COMPLETIONS, "m", "m", {}, headers=headers or {})


def ep(i: int, running: int = 0, waiting: int = 0, kv: float = 0.0, labels: dict[str, str] | None = None) -> Endpoint:
    e = Endpoint(f"e{i}", f"10.0.0.{i}", 8000, labels=labels or {})
    e.metrics = Metrics(waiting, running, kv, update_time=time.monotonic())
    return e
