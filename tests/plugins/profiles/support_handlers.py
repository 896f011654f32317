"""Helpers shared by the header and data-parallel profile handler tests."""

from __future__ import annotations

from epp.framework import ApiKind, InferenceRequest


def req(headers: dict[str, str] | None = None) -> InferenceRequest:
    return InferenceRequest(
        "r", "/v1/completions", ApiKind.COMPLETIONS, "m", "m", {"prompt": "x"}, headers=headers or {}
    )
