"""One KV-cache service per EPP: token processor, index, event applier and pool, built from llm-d-style
parameters (`tokenProcessorConfig`, `indexerConfig`, `kvEventsConfig`). Plugins share it by key."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from epp.framework.params import parse_duration as framework_parse_duration
from epp.framework.types import Endpoint
from epp.kvcache.index import Index, MemoryIndex, PrefixMatch
from epp.kvcache.ingest import EventApplier
from epp.kvcache.pool import EventPool, PoolConfig
from epp.kvcache.tokens import BlockSizes, TokenProcessor, request_extra_keys

log = logging.getLogger(__name__)

SERVICE_KEY = "kv-cache"


def parse_duration(v: Any, default: float) -> float:
    """The framework's Go-style durations ("2s", "500ms", "1m"), plus `None` → `default` and a bare number
    (also as a string, as llm-d's samples write it) in seconds."""
    if v is None:
        return default
    if isinstance(v, str) and re.fullmatch(r"\s*[0-9]*\.?[0-9]+\s*", v):
        return float(v)
    return framework_parse_duration(v.strip() if isinstance(v, str) else v)


@dataclass
class KVCacheSettings:
    block_size: int | None = None  # canonical; None = learn per model from events / scraped metrics
    block_sizes: dict[str, int] = field(default_factory=dict)
    hash_seed: str = ""
    tier_weights: dict[str, float] = field(default_factory=dict)
    max_keys: int | None = None
    max_pods_per_key: int | None = None
    engine_run_size: int | None = None  # compact engine maps (inMemoryConfig.compactEngineMap)
    redis_address: str | None = None
    pool: PoolConfig = field(default_factory=PoolConfig)
    events_enabled: bool = True

    @classmethod
    def from_params(cls, p: dict[str, Any]) -> KVCacheSettings:
        tpc = p.get("tokenProcessorConfig") or {}
        bs = tpc.get("blockSizeTokens", tpc.get("blockSize", p.get("blockSize")))
        idx = p.get("indexerConfig") or {}
        kbi = idx.get("kvBlockIndexConfig") or {}
        mem = kbi.get("inMemoryConfig") or {}
        redis = kbi.get("redisConfig") or kbi.get("valkeyConfig") or {}
        weights = {str(b["name"]): float(b.get("weight", 1.0)) for b in idx.get("kvCacheBackendConfigs") or []}
        addr = redis.get("address")
        if addr:
            addr = str(addr).replace("valkeys://", "rediss://").replace("valkey://", "redis://")
        kec = p.get("kvEventsConfig") or {}
        return cls(
            block_size=int(bs) if bs else None,
            block_sizes={str(k): int(v) for k, v in (tpc.get("blockSizes") or {}).items()},
            hash_seed=str(tpc.get("hashSeed", "")),
            tier_weights=weights,
            max_keys=int(mem["size"]) if mem.get("size") else None,
            max_pods_per_key=int(mem["podCacheSize"]) if mem.get("podCacheSize") else None,
            engine_run_size=int(mem.get("engineRunSize", 65536)) if mem.get("compactEngineMap") else None,
            redis_address=addr,
            pool=PoolConfig.from_params(kec),
            events_enabled=bool(kec.get("enabled", True)),
        )


class KVCacheService:
    """The request-side API (keys for a prompt, prefix matches per endpoint) over the event-fed index."""

    def __init__(self, settings: KVCacheSettings, index: Index | None = None) -> None:
        self.settings = settings
        self.tokens = TokenProcessor(settings.block_size or 16, settings.hash_seed)
        self.block_sizes = BlockSizes(settings.block_sizes, settings.block_size)
        if index is None:
            if settings.redis_address:
                from epp.kvcache.redis_index import RedisIndex

                index = RedisIndex(settings.redis_address, settings.tier_weights)
            else:
                index = MemoryIndex(
                    settings.tier_weights, settings.max_keys, settings.max_pods_per_key, settings.engine_run_size
                )
        self.index = index
        self.applier = EventApplier(index, self.tokens, self.block_sizes)
        self.pool = EventPool(self.applier, settings.pool)

    def block_size_for(self, model: str, endpoints: Sequence[Endpoint] = ()) -> int | None:
        """Configured, else learned from events, else from a scraped `cache_config_info` block size."""
        bs = self.block_sizes.get(model)
        if bs is not None:
            return bs
        for ep in endpoints:
            if ep.metrics.cache_block_size > 0:
                return self.block_sizes.learn(model, ep.metrics.cache_block_size)
        return self.block_sizes.any()

    def request_keys(
        self,
        tokens: Sequence[int],
        model: str,
        endpoints: Sequence[Endpoint] = (),
        cache_salt: str | None = None,
        mm_items: Sequence[tuple[str, int, int]] = (),
    ) -> list[int]:
        bs = self.block_size_for(model, endpoints)
        if bs is None:
            return []
        extra = request_extra_keys(len(tokens) // bs, bs, cache_salt, mm_items)
        return self.tokens.block_keys(tokens, model, None, extra, block_size=bs)

    async def match(self, keys: Sequence[int], pods: Iterable[str] | None = None) -> dict[str, PrefixMatch]:
        return await self.index.lookup(keys, pods)

    def speculate(self, keys: Sequence[int], pod: str, ttl: float) -> None:
        self.index.add_speculative(keys, pod, ttl)
