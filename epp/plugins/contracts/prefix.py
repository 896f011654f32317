"""Prefix-cache match info: how much of the prompt each endpoint caches, from the producer a consumer names."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from epp.framework import PREFIX_CACHE_MATCH_INFO, DataKey, Feed

APPROX_PRODUCER: Final = "approx-prefix-cache-producer"
PRECISE_PRODUCER: Final = "precise-prefix-cache-producer"

# A consumer's `prefixMatchInfoProducerName`; without it, GIE's approximate producer is added.
PREFIX_MATCH: Final = Feed(PREFIX_CACHE_MATCH_INFO, "prefixMatchInfoProducerName", APPROX_PRODUCER)


@dataclass(slots=True)
class PreciseMatch:
    """Per endpoint hostport: consecutive cached blocks from block 0 and their tier-weighted sum."""

    total_blocks: int
    block_size: int
    blocks: dict[str, int] = field(default_factory=dict)
    weighted: dict[str, float] = field(default_factory=dict)
    keys: list[int] = field(default_factory=list)
    # Pods whose match rests on speculative entries (their deepest matched block is held only speculatively: a pick
    # of this replica or another's): their delivered hits say nothing about the index's events.
    speculated: set[str] = field(default_factory=set)


# The precise producer's full match (block keys included), per producer: `PRECISE_MATCH.of(<producer name>)`.
PRECISE_MATCH: Final = DataKey[PreciseMatch]("precise-prefix-match")

# The same match info for consumers that need the precise producer's block keys (`PRECISE_MATCH`) beside it.
PRECISE_PREFIX_MATCH: Final = Feed(PREFIX_CACHE_MATCH_INFO, "prefixMatchInfoProducerName", PRECISE_PRODUCER)
