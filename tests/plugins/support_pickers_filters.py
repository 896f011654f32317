"""Helpers shared by the picker, filter and utilization-detector tests."""

from __future__ import annotations

from epp.framework import ApiKind, CycleState, Endpoint, InferenceRequest

S = CycleState()


R = InferenceRequest("r", "/v1/completions", ApiKind.COMPLETIONS, "m", "m", {})


def eps(n: int) -> list[Endpoint]:
    return [Endpoint(f"e{i}", f"10.0.0.{i + 1}", 8000) for i in range(n)]


def labeled(labels: list[dict[str, str]]) -> list[Endpoint]:
    out = eps(len(labels))
    for e, lab in zip(out, labels, strict=True):
        e.labels = lab
    return out
