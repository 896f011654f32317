"""context-length-aware: range scores, filtering, bad labels."""

from __future__ import annotations

import pytest

from epp.framework import (
    TOKENIZED_PROMPT,
    ApiKind,
    CycleState,
    Endpoint,
    InferenceRequest,
    PluginConfigError,
    TokenizedPrompt,
)
from epp.plugins.scorers.context_length_aware import ContextLengthAware, range_score
from tests.helpers import build

S = CycleState()
LABEL = "llm-d.ai/context-length-range"


def ep(name: str, value: str | None) -> Endpoint:
    return Endpoint(name, "10.0.0.1", 8000, labels={LABEL: value} if value is not None else {})


def req(tokens: int) -> InferenceRequest:
    r = InferenceRequest("r", "/v1/completions", ApiKind.COMPLETIONS, "m", "m", {})
    r.data.put(TOKENIZED_PROMPT, TokenizedPrompt(list(range(tokens))))
    return r


def test_scores() -> None:
    short, long_, none, bad = ep("s", "0-2048"), ep("l", "2048-8192"), ep("n", None), ep("x", "lots")
    scores = build(ContextLengthAware).score(S, req(1000), [short, long_, none, bad])
    # in range: 0.3 + 0.7·(0.7/(1+0.2048) + 0.3·1048/2048); out of range: 0.3/(1 + 1048/1000); no label 0.5; bad 0
    assert scores == pytest.approx([0.3 + 0.7 * (0.7 / 1.2048 + 0.3 * 1048 / 2048), 0.3 / 2.048, 0.5, 0.0])
    assert range_score(5, 5, 5) == 1.0
    assert range_score(9000, 0, 8192) > range_score(9000, 0, 2048)  # the nearer range first
    assert all(0.3 < range_score(n, 0, 100000) <= 1.0 for n in (0, 50000, 100000))


def test_filtering() -> None:
    eps = [ep("s", "0-2048"), ep("l", "2048-8192"), ep("n", None), ep("x", "9-1")]
    kept = build(ContextLengthAware, {"enableFiltering": True}).filter(S, req(3000), eps)
    assert [e.name for e in kept] == ["l", "n"]
    assert len(build(ContextLengthAware).filter(S, req(3000), eps)) == 4  # filtering off by default
    custom = build(ContextLengthAware, {"label": "ctx", "enableFiltering": True})
    assert [e.name for e in custom.filter(S, req(10), [Endpoint("c", "1.1.1.1", 1, labels={"ctx": "20-30"})])] == []


def test_text_estimate_without_a_token_producer_and_label_required() -> None:
    r = InferenceRequest("r", "/v1/completions", ApiKind.COMPLETIONS, "m", "m", {}, prompt="x" * 4000)
    assert build(ContextLengthAware).score(S, r, [ep("a", "1000-1000")]) == [1.0]
    with pytest.raises(PluginConfigError, match="label"):
        build(ContextLengthAware, {"label": ""})
