"""precise-prefix-cache-producer (llm-d): how much of the prompt's KV blocks each endpoint holds, from the KV events
the engines publish.

It consumes the prompt's token ids (TOKENIZED_PROMPT; a token-producer is added with this plugin's tokenizer
settings when none is configured), looks the blocks up in the EPP's KV-block index and publishes the framework's
PrefixCacheMatchInfo under `PREFIX_CACHE_MATCH_INFO.of(<its name>)`, so the generic `prefix-cache-scorer` with
`prefixMatchInfoProducerName` scores it (llm-d's current pipeline). After the pick it writes speculative entries
for the chosen endpoints (primary and, for P/D, prefill) so a burst of the same prefix sticks before the engine's
events arrive. The index (one per EPP) is configured from `tokenProcessorConfig`, `indexerConfig` and
`kvEventsConfig`.

Active-active replicas: the speculative entries are the picking replica's own, so another replica would not know,
until the engine's event arrives (after the prefill, queueing included), that the prompt is being computed on that
pod, and would send the next request of the same prefix elsewhere. With a cross-replica syncer that carries
messages (`dataLayer.crossReplicaSyncerPluginRef` naming a redis-cross-replica-syncer) each pick's entry is also
sent to the other replicas as it is made, unless `syncCrossReplicaState: false`; they add it with the same TTL.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Self

from epp.framework import (
    DISAGG_DECISION,
    PREFIX_CACHE_MATCH_INFO,
    TOKENIZED_PROMPT,
    DataKey,
    Endpoint,
    EndpointView,
    InferenceRequest,
    KVCacheIndex,
    Params,
    Plugin,
    PluginContext,
    PrefixCacheMatchInfo,
    SchedulingResult,
    Usage,
)

log = logging.getLogger(__name__)

TOKEN_PRODUCER = "token-producer"
MAX_SHARED_KEYS = 8192  # block keys per shared speculative entry (a longer prompt shares its first ones)
MAX_SHARED_TTL = 60.0  # seconds: a received entry's TTL is capped
DEFAULT_UDS_SOCKET = "/tmp/tokenizer/tokenizer-uds.socket"  # llm-d-kv-cache's default
# Tokenizer settings llm-d and older pyepp configs put on this plugin; they configure the auto-added token-producer.
TOKENIZER_KEYS = (
    "tokenizer",
    "type",
    "url",
    "vllm",
    "models",
    "modelTokenizerMap",
    "dir",
    "cacheSize",
    "offloadChars",
    "timeout",
)


@dataclass(slots=True)
class PreciseMatch:
    """Per endpoint hostport: consecutive cached blocks from block 0 and their tier-weighted sum."""

    total_blocks: int
    block_size: int
    blocks: dict[str, int] = field(default_factory=dict)
    weighted: dict[str, float] = field(default_factory=dict)
    keys: list[int] = field(default_factory=list)
    # Pods whose match may rest on this producer's own speculative entries (written for a prompt with the same
    # first block, still live): their delivered hits say nothing about the index's events.
    speculated: set[str] = field(default_factory=set)


# The full match (block keys included, for the speculative entries), one key per producer instance.
PRECISE_MATCH = DataKey[PreciseMatch]("precise-prefix-match")


def tokenizer_pool_params(pool: Params) -> dict[str, Any]:
    """llm-d-kv-cache's tokenization pool (`modelName`, `workersCount`, `uds`) as the parameters of the
    token-producer added for it: the UDS sidecar, at most `workersCount` calls in flight (the pool's workers)."""
    model = pool.str("modelName", "")
    if not model:
        raise pool.fail("modelName", "must be set (the model whose tokenizer the pool loads)")
    uds = pool.section("uds")
    out: dict[str, Any] = {
        "socketFile": uds.str("socketFile", DEFAULT_UDS_SOCKET),
        "workersCount": pool.int("workersCount", 5, min=1),
    }
    if uds.bool("useTCP", False):
        out["useTCP"] = True
    if uds.has("modelTokenizerMap"):
        out["modelTokenizerMap"] = dict(uds.mapping("modelTokenizerMap"))
    return {"modelName": model, "udsTokenizerConfig": out}


class PrecisePrefixCacheProducer(Plugin):
    type_name = "precise-prefix-cache-producer"

    def __init__(
        self,
        name: str,
        index: KVCacheIndex,
        speculative: bool = True,
        speculative_ttl: float = 2.0,
        *,
        sync_cross_replica: bool = True,
        endpoints: EndpointView | None = None,
    ) -> None:
        super().__init__(name)
        self.index = index
        self.speculative = speculative
        self.speculative_ttl = speculative_ttl
        self.sync_cross_replica = sync_cross_replica
        self.endpoints = endpoints
        self._send: Callable[[Any], None] | None = None
        self.received = 0  # speculative entries applied from other replicas
        self.refused = 0  # malformed ones, or for a pod not in the pool
        self.info_key = PREFIX_CACHE_MATCH_INFO.of(self.name)
        self.match_key = PRECISE_MATCH.of(self.name)
        self._speculated: dict[tuple[str, int], float] = {}  # (pod, first block key) -> expiry (monotonic)

    # llm-d's legacy precise-prefix-cache-scorer takes `indexerConfig.tokenizersPoolConfig`; the producer refuses it.
    legacy_tokenizer_pool = False

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        index = context.services.kv_cache(params)
        tokenizer = {k: params.raw[k] for k in TOKENIZER_KEYS if params.has(k)}
        indexer = params.section("indexerConfig")
        pool = indexer.section("tokenizersPoolConfig")
        if indexer.has("tokenizersPoolConfig"):
            if not cls.legacy_tokenizer_pool:
                raise indexer.fail(
                    "tokenizersPoolConfig", "is not supported; configure a token-producer plugin instead"
                )
            from_pool = tokenizer_pool_params(pool)
            tokenizer = tokenizer or from_pool
        context.require_producer(TOKENIZED_PROMPT, TOKEN_PRODUCER, TOKEN_PRODUCER, tokenizer, requested_by=name)
        for k in tokenizer:
            params.get(k)
        return cls(
            name,
            index,
            speculative=params.bool("speculativeIndexing", True),
            speculative_ttl=params.duration("speculativeTTL", 2.0),
            sync_cross_replica=params.bool("syncCrossReplicaState", True),
            endpoints=context.endpoints,
        )

    def produces(self) -> Collection[DataKey[Any]]:
        return (self.info_key, self.match_key)

    def consumes(self) -> Collection[DataKey[Any]]:
        return (TOKENIZED_PROMPT,)

    async def prepare(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> None:
        data = request.data
        data.pop(self.match_key)
        data.pop(self.info_key)
        prompt = data.get(TOKENIZED_PROMPT)
        if prompt is None or not prompt.token_ids:
            return
        index = self.index
        salt = request.body.get("cache_salt")
        mm = [(f.hash, f.offset, f.length) for f in prompt.mm_features] if prompt.mm_features else ()
        keys = index.request_keys(
            prompt.token_ids, request.target_model, endpoints, salt if isinstance(salt, str) else None, mm
        )
        if not keys:
            return
        matches = await index.match(keys, [ep.hostport for ep in endpoints])
        bs = index.block_size_for(request.target_model, endpoints) or 0
        now = time.monotonic()
        spec = self._speculated
        info = PreciseMatch(
            total_blocks=len(keys),
            block_size=bs,
            blocks={k: m.blocks for k, m in matches.items()},
            weighted={k: m.weighted for k, m in matches.items()},
            keys=keys,
            speculated={k for k in matches if spec.get((k, keys[0]), 0.0) > now} if spec else set(),
        )
        data.put(self.match_key, info)
        data.put(
            self.info_key,
            PrefixCacheMatchInfo(
                total_blocks=len(keys),
                block_size_tokens=bs,
                matches={ep.name: info.weighted[ep.hostport] for ep in endpoints if ep.hostport in info.weighted},
            ),
        )

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        info = request.data.get(self.match_key)
        if not self.speculative or info is None:
            return
        decision = request.data.get(DISAGG_DECISION)
        if decision is not None:  # P/D: the decode and the prefill pod (an encode pod holds no prompt KV)
            pods = [decision.decode] if decision.prefill is None else [decision.decode, decision.prefill]
        else:
            pods = [pr.targets[0] for pr in result.profile_results.values() if pr is not None and pr.targets]
        seen: set[str] = set()
        for ep in pods:
            if ep.hostport not in seen:
                seen.add(ep.hostport)
                self.index.speculate(info.keys, ep.hostport, self.speculative_ttl)
                self._note_speculation(ep.hostport, info.keys[0])
                if self._send is not None:
                    self._send([ep.hostport, round(self.speculative_ttl * 1000), info.keys[:MAX_SHARED_KEYS]])

    # -- cross-replica: the other replicas' picks ----------------------------------------------------------------

    def cross_replica_channel(self) -> str | None:
        return f"speculative:{self.name}" if self.speculative and self.sync_cross_replica else None

    def cross_replica_connect(self, send: Callable[[Any], None]) -> None:
        self._send = send

    def cross_replica_receive(self, message: Any) -> None:
        """Another replica's pick: [pod host:port, TTL ms, [block keys]]. Applied as if this replica had made it,
        for a pod of this pool only; anything else is refused (counted)."""
        entry = _shared_entry(message)
        if entry is None or (self.endpoints is not None and self.endpoints.get_by_hostport(entry[0]) is None):
            self.refused += 1
            if self.refused == 1 or self.refused % 1000 == 0:
                log.warning("%s: refused a shared speculative entry (%d so far)", self.name, self.refused)
            return
        pod, ttl, keys = entry
        self.index.speculate(keys, pod, ttl)
        self._note_speculation(pod, keys[0], ttl)
        self.received += 1

    def _note_speculation(self, pod: str, first_key: int, ttl: float | None = None) -> None:
        now = time.monotonic()
        spec = self._speculated
        if len(spec) >= 4096:  # bounded: drop the expired ones, and everything if that is not enough
            for k in [k for k, exp in spec.items() if exp <= now]:
                del spec[k]
            if len(spec) >= 65536:
                spec.clear()
        expiry = now + (self.speculative_ttl if ttl is None else ttl)
        spec[(pod, first_key)] = max(spec.get((pod, first_key), 0.0), expiry)

    def response_complete(self, request: InferenceRequest, endpoint: Endpoint | None, usage: Usage | None) -> None:
        """The closed loop on delivered hits: tell the index what the engine delivered against what it predicted
        (the response's cached_tokens, else the engine's scraped prefix-cache counters)."""
        info = request.data.get(self.match_key)
        if info is None or endpoint is None:
            return
        decision = request.data.get(DISAGG_DECISION)
        if decision is not None and decision.prefill is not None:
            return  # P/D: the decode pod's cached tokens came over the KV transfer, not from its own cache
        prompt = usage.prompt_tokens if usage is not None else 0
        if prompt <= 0:
            tokens = request.data.get(TOKENIZED_PROMPT)
            prompt = len(tokens.token_ids) if tokens is not None else 0
        # a burst: the predicted hit may be our own speculation, not yet in the engine's cache
        speculated = endpoint.hostport in info.speculated
        if usage is None or not usage.cached_tokens_reported:
            m = endpoint.metrics
            # the engine still counts this prompt's queries (and any hits): it is in the interval, predicting none
            predicted = 0 if speculated else info.blocks.get(endpoint.hostport, 0)
            self.index.report_counted(
                endpoint.hostport,
                len(info.keys),
                predicted,
                info.block_size,
                prompt,
                m.prefix_cache_hits,
                m.prefix_cache_queries,
            )
            return
        if speculated:
            return
        self.index.report_delivered(
            endpoint.hostport,
            info.keys,
            info.blocks.get(endpoint.hostport, 0),
            usage.cached_tokens,
            info.block_size,
            prompt,
        )


def _shared_entry(message: Any) -> tuple[str, float, list[int]] | None:
    """[pod, ttl_ms, keys] checked: a host:port string, a TTL in (0, MAX_SHARED_TTL], 1..MAX_SHARED_KEYS int keys."""
    if not isinstance(message, list) or len(message) != 3:
        return None
    pod, ttl_ms, keys = message
    if not isinstance(pod, str) or not 0 < len(pod) <= 300:
        return None
    if not isinstance(ttl_ms, int | float) or isinstance(ttl_ms, bool) or not ttl_ms > 0:
        return None
    if not isinstance(keys, list) or not 0 < len(keys) <= MAX_SHARED_KEYS:
        return None
    if not all(type(k) is int and 0 <= k < 1 << 64 for k in keys):
        return None
    return pod, min(float(ttl_ms) / 1000.0, MAX_SHARED_TTL), keys
