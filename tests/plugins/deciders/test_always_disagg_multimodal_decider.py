"""always-disagg-multimodal-decider: multimodal requests are disaggregated, text-only ones are not."""

from __future__ import annotations

from epp.framework import (
    CycleState,
)
from epp.plugins.deciders.always_disagg_multimodal_decider import AlwaysDisaggMultimodalDecider
from tests.plugins.support_disagg import chat


def test_multimodal_decider() -> None:
    d = AlwaysDisaggMultimodalDecider("mm")
    st = CycleState()
    assert not d.disaggregate(st, chat("text only"), None)
    image = [{"type": "text", "text": "what is it"}, {"type": "image_url", "image_url": {"url": "data:x"}}]
    assert d.disaggregate(st, chat("", content=image), None)
    audio = [{"type": "input_audio", "input_audio": {"data": "...", "format": "wav"}}]
    assert d.disaggregate(st, chat("", content=audio), None)
