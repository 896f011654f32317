"""models-data-extractor (llm-d-router): the models an endpoint serves, from its `/v1/models` answer, as the
`/v1/models` attribute: a tuple of (id, parent) (parent "" for a base model), at most 1024 entries."""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any

from epp.framework import DataKey, Endpoint, Plugin

MODELS: DataKey[tuple[tuple[str, str], ...]] = DataKey("/v1/models")
MAX_MODELS = 1024


class ModelsDataExtractor(Plugin):
    type_name = "models-data-extractor"

    def produces(self) -> Collection[DataKey[Any]]:
        return (MODELS,)

    def extract(self, endpoint: Endpoint, text: str) -> None:
        try:
            doc = json.loads(text)
        except ValueError:
            return
        data = doc.get("data") if isinstance(doc, dict) else None
        if not isinstance(data, list):
            return
        out = []
        for m in data[:MAX_MODELS]:
            if isinstance(m, dict) and isinstance(m.get("id"), str):
                parent = m.get("parent")
                out.append((m["id"], parent if isinstance(parent, str) else ""))
        endpoint.attributes.put(MODELS, tuple(out))

    def forget(self, endpoint: Endpoint) -> None:
        endpoint.attributes.pop(MODELS)
