"""prefix-based-pd-decider (llm-d): disaggregate when the part of the prompt the decode pod does not cache is long.

`nonCachedTokens` (0 = never disaggregate): run the prefill stage when prompt tokens - tokens the chosen decode
pod already caches >= nonCachedTokens. `promptTokens` (0 = off): prompts shorter than this never disaggregate.
The prompt length comes from TOKENIZED_PROMPT when a token-producer ran, else it is estimated from the text (4
characters a token, as llm-d's `estimate` tokenizer backend); the cached prefix comes from the prefix producer's
PrefixCacheMatchInfo for the decode pod (matched blocks x block size). Which producer: the one named by our
`prefixMatchInfoProducerName`, else the first configured prefix producer, else an approx-prefix-cache-producer is
added (as llm-d does).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Self

from epp.framework import (
    PREFIX_CACHE_MATCH_INFO,
    TOKENIZED_PROMPT,
    CycleState,
    DataKey,
    Endpoint,
    InferenceRequest,
    Params,
    Plugin,
    PluginConfigError,
    PluginContext,
    PrefixCacheMatchInfo,
)
from epp.plugins.contracts.prefix import APPROX_PRODUCER, PREFIX_MATCH

log = logging.getLogger(__name__)

CHARS_PER_TOKEN = 4
_MATCH_PREFIX = PREFIX_CACHE_MATCH_INFO.name + "/"


def estimate_prompt_tokens(request: InferenceRequest) -> int:
    """Prompt tokens from the text alone (characters / 4), for configs without a token-producer."""
    chars = 0
    if request.messages is not None:
        for m in request.messages:
            content = m.get("content") if isinstance(m, dict) else None
            if isinstance(content, str):
                chars += len(content)
            elif isinstance(content, list):
                for block in content:
                    if isinstance(block, dict) and isinstance(block.get("text"), str):
                        chars += len(block["text"])
    elif isinstance(request.prompt, str):
        chars = len(request.prompt)
    elif isinstance(request.prompt, list):
        if request.prompt and all(isinstance(t, int) for t in request.prompt):
            return len(request.prompt)  # token ids
        chars = sum(len(p) for p in request.prompt if isinstance(p, str))
    return chars // CHARS_PER_TOKEN


def prompt_tokens(request: InferenceRequest) -> int:
    tokenized = request.data.get(TOKENIZED_PROMPT)
    if tokenized is not None and tokenized.token_ids:
        return len(tokenized.token_ids)
    return estimate_prompt_tokens(request)


def cached_tokens(info: PrefixCacheMatchInfo, endpoint: Endpoint) -> int:
    return int(info.matches.get(endpoint.name, 0.0) * info.block_size_tokens)


class PrefixBasedPDDecider(Plugin):
    type_name = "prefix-based-pd-decider"

    def __init__(
        self, name: str | None = None, non_cached_tokens: int = 0, prompt_tokens: int = 0, producer: str = ""
    ) -> None:
        super().__init__(name)
        self.non_cached_tokens = non_cached_tokens
        self.prompt_tokens = prompt_tokens
        self.producer = producer
        self.key: DataKey[PrefixCacheMatchInfo] | None = PREFIX_CACHE_MATCH_INFO.of(producer) if producer else None
        self._producer_params: dict[str, Any] = {}

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        decider = cls(
            name,
            non_cached_tokens=params.int("nonCachedTokens", 0, min=0),
            prompt_tokens=params.int("promptTokens", 0, min=0),
            producer=params.str(PREFIX_MATCH.parameter, ""),
        )
        if decider.non_cached_tokens == 0:
            log.info("%s: prefix-based P/D disaggregation disabled (nonCachedTokens is 0)", name)
        return decider

    def resolve_plugins(self, plugins: Mapping[str, Plugin], context: PluginContext) -> None:
        """Find the prefix producer whose match info tells how much the decode pod caches."""
        if self.producer:
            p = plugins.get(self.producer)
            if p is None or self.key not in p.produces():
                raise PluginConfigError(
                    f"{self.name}: parameter '{PREFIX_MATCH.parameter}': no configured plugin named "
                    f"{self.producer!r} produces prefix-cache match info",
                    key=PREFIX_MATCH.parameter,
                )
            return
        for p in plugins.values():
            for key in p.produces():
                if key.name.startswith(_MATCH_PREFIX):
                    self.key = PREFIX_CACHE_MATCH_INFO.of(key.name[len(_MATCH_PREFIX) :])
                    return
        if self.non_cached_tokens > 0:
            self.key = PREFIX_MATCH.of(APPROX_PRODUCER)
            context.require_producer(
                self.key, APPROX_PRODUCER, APPROX_PRODUCER, self._producer_params, requested_by=self.name
            )

    def disaggregate(self, state: CycleState, request: InferenceRequest, endpoint: Endpoint | None) -> bool:
        threshold = self.non_cached_tokens
        if threshold == 0:
            return False
        if endpoint is None:
            log.error("%s: no decode endpoint to compare the prompt against", self.name)
            return False
        tokens = prompt_tokens(request)
        if self.prompt_tokens > 0 and tokens < self.prompt_tokens:
            return False
        if tokens < threshold:
            return False
        info = request.data.get(self.key) if self.key is not None else None
        if info is None:
            log.debug("%s: request %s has no prefix-cache match info; not disaggregated", self.name, request.request_id)
            return False
        uncached = tokens - cached_tokens(info, endpoint)
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "%s: request %s: %d prompt tokens, %d uncached on %s (threshold %d)",
                self.name,
                request.request_id,
                tokens,
                uncached,
                endpoint.name,
                threshold,
            )
        return uncached >= threshold
