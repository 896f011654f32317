"""always-disagg-multimodal-decider: multimodal requests are disaggregated, text-only ones are not."""

from __future__ import annotations

from typing import Any

from epp.framework import (
    CycleState,
    InferenceRequest,
)
from epp.plugins.deciders.always_disagg_multimodal_decider import AlwaysDisaggMultimodalDecider


def chat(text: str, rid: str = "r", headers: dict[str, str] | None = None, content: Any = None) -> InferenceRequest:
    msgs = [{"role": "user", "content": content if content is not None else text}]
    body = {"model": "m", "messages": msgs}
    return InferenceRequest(rid, "/v1/chat/completions", "chat", "m", "m", body, headers=headers or {}, messages=msgs)


def test_multimodal_decider() -> None:
    d = AlwaysDisaggMultimodalDecider("mm")
    st = CycleState()
    assert not d.disaggregate(st, chat("text only"), None)
    image = [{"type": "text", "text": "what is it"}, {"type": "image_url", "image_url": {"url": "data:x"}}]
    assert d.disaggregate(st, chat("", content=image), None)
    audio = [{"type": "input_audio", "input_audio": {"data": "...", "format": "wav"}}]
    assert d.disaggregate(st, chat("", content=audio), None)
