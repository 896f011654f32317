"""Helpers shared by the session-affinity filter, producer and scorer tests."""

from __future__ import annotations

from epp.framework import (
    ApiKind,
    CycleState,
    Endpoint,
    InferenceRequest,
    ProfileResult,
    SchedulingResult,
)

A, B, P = (Endpoint(n, f"10.0.0.{i}", 8000) for i, n in enumerate(("a", "b", "p"), 1))


def result(primary: Endpoint, prefill: Endpoint | None = None) -> SchedulingResult:
    prs = {"decode": ProfileResult([primary])}
    if prefill is not None:
        prs["prefill"] = ProfileResult([prefill])
    return SchedulingResult(prs, "decode")


S = CycleState()


def req(headers: dict[str, str] | None = None) -> InferenceRequest:
    return InferenceRequest("r", "/v1/completions", ApiKind.COMPLETIONS, "m", "m", {}, headers=headers or {})
