"""mm-embeddings-cache-producer (llm-d): encoder-cache affinity for multimodal prompts.

The model server keeps the encoder's output for recent multimodal items (its encoder cache, keyed by vLLM's mm hash),
so a pod that already encoded an image skips the vision encoder for it. This producer remembers, per endpoint, the
mm hashes of the items recently routed there: an LRU of `cacheSizeInMBPerServer` MiB / 2 MiB entries (the router's
fixed 2 MiB per item; default 4096 MiB = 2048 items). For each request it reads the items' hashes from the
tokenized prompt (TOKENIZED_PROMPT's `mm_features`; a token-producer is added when none is configured), counts the
distinct ones each endpoint holds and publishes `MM_CACHE_MATCH.of(<its name>)`, which `mm-embeddings-cache-scorer`
turns into matched / total. After the pick (PreRequest) the primary profile's targets record the items. An endpoint
that leaves the pool drops its LRU. As the router: a best-effort routing signal, not the server's real cache state.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Sequence
from typing import Any, Self

from prometheus_client import Counter, Histogram

from epp.framework import (
    TOKENIZED_PROMPT,
    DataKey,
    Endpoint,
    InferenceRequest,
    Params,
    Plugin,
    PluginContext,
    RemovalListener,
    SchedulingResult,
)
from epp.plugins.contracts.multimodal import MM_CACHE_MATCH, MM_PRODUCER, MMCacheMatch
from epp.plugins.contracts.prompt import TOKEN_PRODUCER

TYPE = MM_PRODUCER
DEFAULT_CACHE_SIZE_MB = 4096
BYTES_PER_ITEM = 2 * 1024 * 1024  # the router's assumed size of one tracked item
_MODALITIES = frozenset({"image", "audio", "video"})


QUERIES = Counter(
    "llm_d_epp_encoder_cache_queries_total",
    "Total number of multimodal item hash lookups made against the encoder-cache affinity LRU.",
    ["plugin_type", "plugin_name", "modality"],
)
HITS = Counter(
    "llm_d_epp_encoder_cache_hits_total",
    "Total number of multimodal item hash lookups that found a match in the encoder-cache affinity LRU, by endpoint.",
    ["plugin_type", "plugin_name", "pod", "modality"],
)
HIT_RATIO = Histogram(
    "llm_d_epp_encoder_cache_hit_ratio",
    "Ratio of matched multimodal items to total items per endpoint in an encoder-cache lookup.",
    ["plugin_type", "plugin_name"],
    buckets=(0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0),
)


def lru_capacity(cache_size_mb: int) -> int:
    """Entries per endpoint for a MiB budget (<= 0 means the default), as the router derives it."""
    mb = cache_size_mb if cache_size_mb > 0 else DEFAULT_CACHE_SIZE_MB
    return max(1, mb * 1024 * 1024 // BYTES_PER_ITEM)


def request_items(request: InferenceRequest) -> dict[str, str]:
    """The distinct mm hashes of the request's items (from the tokenized prompt), with their modality."""
    prompt = request.data.get(TOKENIZED_PROMPT)
    features = prompt.mm_features if prompt is not None else None
    if not features:
        return {}
    return {f.hash: f.modality for f in features if f.hash}


class MMEmbeddingsCacheProducer(Plugin, RemovalListener):
    type_name = TYPE

    def __init__(self, name: str = TYPE, cache_size_mb: int = DEFAULT_CACHE_SIZE_MB) -> None:
        super().__init__(name)
        self.capacity = lru_capacity(cache_size_mb)
        self.key = MM_CACHE_MATCH.of(self.name)
        self.caches: dict[str, OrderedDict[str, None]] = {}  # endpoint name -> LRU of mm hashes (oldest first)

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        # Only the router's name: its v0.10 Parameters has no `cacheSizeInMB` and its strict decoder rejects it
        # (even in its own deploy/config/epp-mm-embeddings-cache-config.yaml), so it is an unknown parameter here.
        size = params.int("cacheSizeInMBPerServer", 0)
        context.require_producer(TOKENIZED_PROMPT, TOKEN_PRODUCER, TOKEN_PRODUCER, requested_by=name)
        producer = cls(name, size)
        context.endpoints.subscribe(producer)
        return producer

    def produces(self) -> Collection[DataKey[Any]]:
        return (self.key,)

    def consumes(self) -> Collection[DataKey[Any]]:
        return (TOKENIZED_PROMPT,)

    async def prepare(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> None:
        request.data.pop(self.key)
        items = request_items(request)
        if not items:
            return
        match = MMCacheMatch(items)
        caches = self.caches
        for h, modality in items.items():
            label = modality if modality in _MODALITIES else "other"
            QUERIES.labels(TYPE, self.name, label).inc()
            for pod, held in caches.items():
                if h in held:
                    HITS.labels(TYPE, self.name, pod, label).inc()
        total = len(items)
        for ep in endpoints:
            cache = caches.get(ep.name)
            n = sum(1 for h in items if h in cache) if cache else 0
            match.matched[ep.name] = n
            HIT_RATIO.labels(TYPE, self.name).observe(n / total)
        request.data.put(self.key, match)

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        """The primary profile's targets now hold the request's items (most recent first to be kept)."""
        match = request.data.get(self.key)
        if match is None or not match.items:
            return
        for ep in result.targets:
            cache = self.caches.setdefault(ep.name, OrderedDict())
            for h in match.items:
                if h in cache:
                    cache.move_to_end(h)
                else:
                    cache[h] = None
                    if len(cache) > self.capacity:
                        cache.popitem(last=False)

    # -- endpoints: a removed one's LRU goes with it -------------------------------------------------------------

    def endpoint_removed(self, endpoint: Endpoint) -> None:
        self.caches.pop(endpoint.name, None)
