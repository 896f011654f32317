"""precise-prefix-cache-producer (llm-d): how much of the prompt's KV blocks each endpoint holds, from the KV events
the engines publish.

It consumes the prompt's token ids (TOKENIZED_PROMPT; a token-producer is added with this plugin's tokenizer
settings when none is configured), looks the blocks up in the EPP's KV-block index and publishes the framework's
PrefixCacheMatchInfo under `PREFIX_CACHE_MATCH_INFO.of(<its name>)`, so the generic `prefix-cache-scorer` with
`prefixMatchInfoProducerName` scores it (llm-d's current pipeline). After the pick it writes speculative entries
for the chosen endpoints (primary and, for P/D, prefill) so a burst of the same prefix sticks before the engine's
events arrive. The index (one per EPP) is configured from `tokenProcessorConfig`, `indexerConfig` and
`kvEventsConfig`.

pyepp's `approximateFallback: true` (off by default, as llm-d has no such thing; on in pyepp's default config):
an endpoint whose KV events have stored nothing in the index since it joined the pool (no publisher, events off,
not received, an engine that publishes none) is matched from this producer's own routing history instead, as GIE's
`approx-prefix-cache-producer` would match it (prompt text in 4-characters-a-token blocks, an LRU per endpoint).
Its first stored event switches it to the index and drops its history. A request the index cannot key (not
tokenized, no block size known yet) is matched from the history for every endpoint.

Active-active replicas: the speculative entries are the picking replica's own, so another replica would not know,
until the engine's event arrives (after the prefill, queueing included), that the prompt is being computed on that
pod, and would send the next request of the same prefix elsewhere. With a cross-replica syncer that carries
messages (`dataLayer.crossReplicaSyncerPluginRef` naming a redis-cross-replica-syncer) each pick's entry is also
sent to the other replicas as it is made, unless `syncCrossReplicaState: false`; they add it with the same TTL.

pyepp's `speculativeHold` (a duration, 0 by default: llm-d's fixed `speculativeTTL`; 30s in pyepp's default config):
a pick's speculative entries outlive `speculativeTTL` until the pod's KV events hold the prompt's blocks or the
request ends (then `speculativeTTL` more), at most that long after the pick. Under load a prefill waits in the pod's
queue longer than the TTL, and without the hold the next request of the same prefix, arriving in that wait, finds it
nowhere and is sent to compute it again elsewhere. Other replicas get the entry with the plain TTL.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any, Self

from epp.framework import (
    DISAGG_DECISION,
    PREFIX_CACHE_MATCH_INFO,
    RESPONSE_STATUS,
    TOKENIZED_PROMPT,
    CountedReport,
    DataKey,
    Endpoint,
    EndpointView,
    InferenceRequest,
    KVCacheIndex,
    Params,
    Plugin,
    PluginContext,
    PrefixCacheMatchInfo,
    RemovalListener,
    SchedulingResult,
    SpeculationHold,
    Usage,
)
from epp.plugins.contracts.prefix import PRECISE_MATCH, PreciseMatch
from epp.plugins.contracts.prompt import TOKEN_PRODUCER
from epp.plugins.producers.approx_prefix_cache_producer import ApproxPrefixCacheProducer

log = logging.getLogger(__name__)

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


# Endpoints (by name) this request was matched for from the approximate fallback's history, for PreRequest.
FALLBACK_MATCHED = DataKey[frozenset[str]]("precise-prefix-fallback-endpoints")
# The hold on this request's speculative entries (speculativeHold), ended when the response does.
SPECULATION_HOLD = DataKey[SpeculationHold]("precise-prefix-speculation-hold")


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


class PrecisePrefixCacheProducer(Plugin, RemovalListener):
    type_name = "precise-prefix-cache-producer"
    records_only = True  # PreRequest writes only speculative entries and the routing history: may run after the answer

    def __init__(
        self,
        name: str,
        index: KVCacheIndex,
        speculative: bool = True,
        speculative_ttl: float = 2.0,
        *,
        speculative_hold: float = 0.0,
        sync_cross_replica: bool = True,
        endpoints: EndpointView | None = None,
        fallback: ApproxPrefixCacheProducer | None = None,
    ) -> None:
        super().__init__(name)
        self.index = index
        self.speculative = speculative
        self.speculative_ttl = speculative_ttl
        self.speculative_hold = speculative_hold
        self.sync_cross_replica = sync_cross_replica
        self.endpoints = endpoints
        self._send: Callable[[Any], None] | None = None
        self.received = 0  # speculative entries applied from other replicas
        self.refused = 0  # malformed ones, or for a pod not in the pool
        self.info_key = PREFIX_CACHE_MATCH_INFO.of(self.name)
        self.match_key = PRECISE_MATCH.of(self.name)
        self.fallback_key = FALLBACK_MATCHED.of(self.name)
        self.hold_key = SPECULATION_HOLD.of(self.name)
        # approximateFallback: GIE's approximate producer, private to this one (its index holds only the endpoints
        # routed to while they had no events); `_in_history` names the endpoints it has entries for.
        self.fallback = fallback
        self._in_history: set[str] = set()

    # llm-d's legacy precise-prefix-cache-scorer takes `indexerConfig.tokenizersPoolConfig`; the producer refuses it.
    legacy_tokenizer_pool = False

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        index = context.services.kv_cache(params)
        tokenizer = {k: params.raw[k] for k in TOKENIZER_KEYS if params.has(k)}
        indexer = params.section("indexerConfig")
        pool = indexer.section("tokenizersPoolConfig")
        source = ""
        if indexer.has("tokenizersPoolConfig"):
            if not cls.legacy_tokenizer_pool:
                raise indexer.fail(
                    "tokenizersPoolConfig", "is not supported; configure a token-producer plugin instead"
                )
            from_pool = tokenizer_pool_params(pool)
            if not tokenizer:
                tokenizer, source = from_pool, "indexerConfig.tokenizersPoolConfig"
        context.require_producer(
            TOKENIZED_PROMPT, TOKEN_PRODUCER, TOKEN_PRODUCER, tokenizer, requested_by=name, source=source
        )
        for k in tokenizer:
            params.get(k)
        fallback = None
        if params.bool("approximateFallback", False):
            # GIE's approximate producer with its defaults (block size from the engines' scraped cache config)
            fallback = ApproxPrefixCacheProducer(f"{name}/approximate-fallback")
        producer = cls(
            name,
            index,
            speculative=params.bool("speculativeIndexing", True),
            speculative_ttl=params.duration("speculativeTTL", 2.0),
            speculative_hold=params.duration("speculativeHold", 0.0),
            sync_cross_replica=params.bool("syncCrossReplicaState", True),
            endpoints=context.endpoints,
            fallback=fallback,
        )
        if fallback is not None:
            context.endpoints.subscribe(producer)
        return producer

    # Datastore listener (approximateFallback only): an endpoint that left takes its history with it.
    def endpoint_removed(self, endpoint: Endpoint) -> None:
        if self.fallback is not None and endpoint.name in self._in_history:
            self._in_history.discard(endpoint.name)
            self.fallback.index.remove_endpoint(endpoint.name)

    def produces(self) -> Collection[DataKey[Any]]:
        return (self.info_key, self.match_key)

    def consumes(self) -> Collection[DataKey[Any]]:
        return (TOKENIZED_PROMPT,)

    async def prepare(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> None:
        data = request.data
        data.pop(self.match_key)
        data.pop(self.info_key)
        data.pop(self.fallback_key)
        prompt = data.get(TOKENIZED_PROMPT)
        keys: list[int] = []
        index = self.index
        if prompt is not None and prompt.token_ids:
            salt = request.body.get("cache_salt")
            mm = [(f.hash, f.offset, f.length) for f in prompt.mm_features] if prompt.mm_features else ()
            keys = index.request_keys(
                prompt.token_ids, request.target_model, endpoints, salt if isinstance(salt, str) else None, mm
            )
        if keys:
            await self._precise_match(request, endpoints, keys)
        if self.fallback is not None:
            self._fallback_match(request, endpoints, keys)

    async def _precise_match(self, request: InferenceRequest, endpoints: Sequence[Endpoint], keys: list[int]) -> None:
        index = self.index
        data = request.data
        matches = await index.match(keys, [ep.hostport for ep in endpoints])
        bs = index.block_size_for(request.target_model, endpoints) or 0
        info = PreciseMatch(
            total_blocks=len(keys),
            block_size=bs,
            blocks={k: m.blocks for k, m in matches.items()},
            weighted={k: m.weighted for k, m in matches.items()},
            keys=keys,
            # a pod whose deepest matched block is held only speculatively: its match rests on a pick's entries
            speculated={k for k, m in matches.items() if m.blocks and index.speculative_only(k, keys[m.blocks - 1])},
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

    def _fallback_match(self, request: InferenceRequest, endpoints: Sequence[Endpoint], keys: list[int]) -> None:
        """approximateFallback: the index's match for the endpoints whose events it holds, the routing history's
        for the others (scaled to the index's blocks); the history's for all when the request has no keys."""
        fallback = self.fallback
        assert fallback is not None
        index = self.index
        if keys:
            stale = []
            for ep in endpoints:
                if not index.publishes(ep.hostport):
                    stale.append(ep)
                elif ep.name in self._in_history:  # its events arrived: the index knows better than the history
                    self._in_history.discard(ep.name)
                    fallback.index.remove_endpoint(ep.name)
            if not stale:
                return
        else:
            stale = list(endpoints)
        approx = fallback.produce(request, stale)  # also keeps the prompt's hashes in request.data for PreRequest
        request.data.put(self.fallback_key, frozenset(ep.name for ep in stale))
        info = request.data.get(self.info_key)
        if info is None or not info.total_blocks:
            request.data.put(self.info_key, approx)
        elif approx.total_blocks:
            # the history's share of the prompt, in the index's blocks; a prompt longer than the history hashes
            # (maxPrefixBlocksToMatch) is converted by tokens instead (4 characters a token, as the history counts)
            if approx.total_blocks < fallback.max_blocks:
                scale = info.total_blocks / approx.total_blocks
            else:
                scale = approx.block_size_tokens / max(1, info.block_size_tokens)
            for name, blocks in approx.matches.items():
                info.matches[name] = min(float(info.total_blocks), blocks * scale)

    def _record_history(self, request: InferenceRequest, result: SchedulingResult, stale: frozenset[str]) -> None:
        """Remember where the request went, for the endpoints matched from the history (GIE's PreRequest: the
        primary pick and, for P/D, the prefill pick)."""
        fallback = self.fallback
        assert fallback is not None
        picked = [ep for ep in fallback.targets(request, result) if ep.name in stale]
        if picked:
            self._in_history.update(ep.name for ep in picked)
            fallback.record_later(request, picked)

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        if self.fallback is not None:
            stale = request.data.get(self.fallback_key)
            if stale:
                self._record_history(request, result, stale)
        info = request.data.get(self.match_key)
        if not self.speculative or info is None:
            return
        decision = request.data.get(DISAGG_DECISION)
        if decision is not None:  # P/D: the decode and the prefill pod (an encode pod holds no prompt KV)
            pods = [decision.decode] if decision.prefill is None else [decision.decode, decision.prefill]
        else:
            pods = [pr.targets[0] for pr in result.profile_results.values() if pr is not None and pr.targets]
        hold = None
        if self.speculative_hold > 0:
            now = time.monotonic()
            prev = request.data.pop(self.hold_key)  # picked again (a retry): the last pick's entries go on the TTL
            if prev is not None:
                prev.end(now)
            hold = SpeculationHold(self.speculative_ttl, self.speculative_hold, now)
            request.data.put(self.hold_key, hold)
        seen: set[str] = set()
        for ep in pods:
            if ep.hostport not in seen:
                seen.add(ep.hostport)
                self.index.speculate(info.keys, ep.hostport, self.speculative_ttl, hold)
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
        self.received += 1

    def cross_replica_reset(self) -> None:
        """Nothing to undo: the other replicas' entries expire with their TTL."""

    def response_complete(self, request: InferenceRequest, endpoint: Endpoint | None, usage: Usage | None) -> None:
        """The closed loop on delivered hits: tell the index what the engine delivered against what it predicted
        (the response's cached_tokens, else the engine's scraped prefix-cache counters)."""
        hold = request.data.get(self.hold_key)
        if hold is not None:
            hold.end(time.monotonic())
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
            status = request.data.get(RESPONSE_STATUS)
            if status is not None and not 200 <= status < 300:
                return  # an error: the engine computed no prefill the counters could compare with
            m = endpoint.metrics
            # the engine still counts this prompt's queries (and any hits): it is in the interval, predicting none
            predicted = 0 if speculated else info.blocks.get(endpoint.hostport, 0)
            self.index.report_counted(
                CountedReport(
                    endpoint.hostport,
                    len(info.keys),
                    predicted,
                    info.block_size,
                    prompt,
                    m.prefix_cache_hits,
                    m.prefix_cache_queries,
                )
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
