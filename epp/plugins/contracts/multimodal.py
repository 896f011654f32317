"""The encoder-cache match: which of a request's multimodal items each endpoint likely holds."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from epp.framework import DataKey, Feed

MM_PRODUCER: Final = "mm-embeddings-cache-producer"


@dataclass(slots=True)
class MMCacheMatch:
    """A request's distinct multimodal items and, per endpoint name, how many of them it likely caches."""

    items: dict[str, str]  # mm hash -> modality
    matched: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return len(self.items)


# The router's EncoderCacheMatchInfo, per producer: `MM_CACHE_MATCH.of(<producer name>)`, in `request.data`.
MM_CACHE_MATCH: Final = DataKey[MMCacheMatch]("mm-encoder-cache-match-info")

# mm-embeddings-cache-scorer's `producerName`; the producer is not added for it (the router's behaviour).
MM_MATCH: Final = Feed(MM_CACHE_MATCH, "producerName", MM_PRODUCER)
