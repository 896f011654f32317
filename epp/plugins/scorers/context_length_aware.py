"""context-length-aware (llm-d): route by the prompt's length to pods labelled with the range they serve
(`llm-d.ai/context-length-range: "min-max"`, the label name set by `label`).

Score: inside the range 0.3 + 0.7·(0.7/(1 + width/10000) + 0.3·(max - length)/width) (1.0 for a zero-width range):
tighter ranges and more headroom score higher, always above 0.3; outside it 0.3/(1 + distance/1000), nearer ranges
first; 0.5 without the label; 0.0 for a label that does not parse. With `enableFiltering` it also filters out pods
whose range does not hold the length (unlabelled pods stay). The length is the token count from a token-producer,
else the text estimate (4 characters a token).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from typing import Any, Self

from epp.framework import (
    TOKENIZED_PROMPT,
    CycleState,
    DataKey,
    Endpoint,
    InferenceRequest,
    Params,
    Plugin,
    PluginContext,
)
from epp.plugins.contracts.prompt import input_tokens

log = logging.getLogger(__name__)

DEFAULT_LABEL = "llm-d.ai/context-length-range"
MAX_FALLBACK_SCORE = 0.3


def parse_range(value: str) -> tuple[int, int]:
    bounds = value.split("-")
    if not value or len(bounds) != 2:
        raise ValueError(f"invalid range format: {value!r} (expected 'min-max')")
    lo, hi = int(bounds[0].strip()), int(bounds[1].strip())
    if lo > hi:
        raise ValueError(f"min ({lo}) cannot be greater than max ({hi})")
    return lo, hi


def range_score(length: int, lo: int, hi: int) -> float:
    if lo <= length <= hi:
        width = hi - lo
        if width == 0:
            return 1.0
        raw = 0.7 * (1.0 / (1.0 + width / 10000.0)) + 0.3 * ((hi - length) / width)
        return MAX_FALLBACK_SCORE + raw * (1.0 - MAX_FALLBACK_SCORE)
    distance = length - hi if length > hi else lo - length
    return MAX_FALLBACK_SCORE / (1.0 + distance / 1000.0)


class ContextLengthAware(Plugin):
    type_name = "context-length-aware"

    def __init__(self, name: str | None = None, label: str = DEFAULT_LABEL, enable_filtering: bool = False) -> None:
        super().__init__(name)
        self.label = label
        self.enable_filtering = enable_filtering

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        label = params.str("label", DEFAULT_LABEL)
        if not label:
            raise params.fail("label", "must be specified")
        return cls(name, label=label, enable_filtering=params.bool("enableFiltering", False))

    def uses(self) -> Collection[DataKey[Any]]:
        return (TOKENIZED_PROMPT,)

    def _range(self, ep: Endpoint) -> tuple[int, int] | None:
        """The endpoint's range; raises ValueError for a malformed label. None without the label."""
        value = ep.labels.get(self.label)
        return None if value is None else parse_range(value)

    def filter(self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[Endpoint]:
        if not self.enable_filtering:
            return list(endpoints)
        length = input_tokens(request)
        kept = []
        for ep in endpoints:
            try:
                r = self._range(ep)
            except ValueError as e:
                log.warning("%s: endpoint %s: bad %s label: %s", self.name, ep.name, self.label, e)
                continue
            if r is None or r[0] <= length <= r[1]:
                kept.append(ep)
        return kept

    def score(self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[float]:
        length = input_tokens(request)
        out = []
        for ep in endpoints:
            try:
                r = self._range(ep)
            except ValueError:
                out.append(0.0)
                continue
            out.append(0.5 if r is None else range_score(length, r[0], r[1]))
        return out
