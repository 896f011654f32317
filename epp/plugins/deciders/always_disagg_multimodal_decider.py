"""always-disagg-multimodal-decider (llm-d): run the encode stage when a chat message carries an image, a video
or audio (`image_url`, `video_url`, `input_audio` content blocks); text-only requests skip it."""

from __future__ import annotations

from typing import Any

from epp.framework import CycleState, Endpoint, InferenceRequest, Plugin

MULTIMODAL_TYPES = frozenset({"image_url", "video_url", "input_audio"})


def has_multimodal_content(request: InferenceRequest) -> bool:
    messages: Any = request.messages if request.messages is not None else request.body.get("messages")
    if not isinstance(messages, list):
        return False
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list):
            for block in content:
                if isinstance(block, dict) and block.get("type") in MULTIMODAL_TYPES:
                    return True
    return False


class AlwaysDisaggMultimodalDecider(Plugin):
    type_name = "always-disagg-multimodal-decider"

    def disaggregate(self, state: CycleState, request: InferenceRequest, endpoint: Endpoint | None) -> bool:
        return has_multimodal_content(request)
