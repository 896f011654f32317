"""Precise prefix-cache routing: score each endpoint by the longest prefix of the request's KV blocks it
holds, as reported by the engines' KV events (llm-d's precise-prefix-cache-scorer / -producer).

`tokenizer` (a DataProducer) puts the prompt's token ids in `request.data["tokens"]`;
`precise-prefix-cache-producer` (DataProducer + PreRequest) looks the blocks up and publishes the
framework's PrefixCacheMatchInfo under `prefix_match_key(<its name>)` (so the generic
`prefix-cache-scorer` with `prefixMatchInfoProducerName` scores it, as in llm-d's current pipeline),
then writes speculative entries for the pick;
`precise-prefix-cache-scorer` is both in one plugin plus the Scorer: matched/total, tier-weighted.
They share one KV-cache service (index + event pool) and one tokenizer through the PluginContext.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Self

from epp.framework import registry
from epp.framework.plugins import Plugin
from epp.framework.types import (
    CycleState,
    Endpoint,
    InferenceRequest,
    PrefixCacheMatchInfo,
    SchedulingResult,
    prefix_match_key,
)
from epp.kvcache.service import SERVICE_KEY, KVCacheService, KVCacheSettings, parse_duration
from epp.tokenization.prompt import HFBackend, HTTPBackend, PromptTokenizer, TokenizationError

log = logging.getLogger(__name__)

TOKENS_KEY = "tokens"
MATCH_KEY = "prefix-cache-match"
TOKENIZER_SERVICE = "tokenizer"


@dataclass(slots=True)
class PreciseMatch:
    """Per endpoint hostport: consecutive cached blocks from block 0 and their tier-weighted sum."""

    total_blocks: int
    block_size: int
    blocks: dict[str, int] = field(default_factory=dict)
    weighted: dict[str, float] = field(default_factory=dict)
    keys: list[int] = field(default_factory=list)


def build_tokenizer(params: dict[str, Any]) -> PromptTokenizer:
    """`tokenizer: {type: hf|vllm, models: {model: dir}, dir, url, cacheSize}`; default: the Qwen2.5 builder."""
    cfg = params.get("tokenizer") or params
    raw_vllm = cfg.get("vllm")
    vllm: dict[str, Any] = raw_vllm if isinstance(raw_vllm, dict) else {}
    kind = str(cfg.get("type", "vllm" if vllm else "hf")).lower()  # llm-d's token-producer: `vllm: {url}`
    size = int(cfg.get("cacheSize", 1024))
    if kind in ("vllm", "http", "server"):
        url = cfg.get("url") or vllm.get("url") or "http://localhost:8000"
        timeout = parse_duration(cfg.get("timeout", vllm.get("timeout")), 5.0)
        return PromptTokenizer(HTTPBackend(str(url), timeout), size)
    models = dict(cfg.get("models") or cfg.get("modelTokenizerMap") or {})
    default_dir = cfg.get("dir")
    if not models and not default_dir:
        from epp.tokenization.qwen import qwen25_tokenizer_dir

        default_dir = qwen25_tokenizer_dir()
    return PromptTokenizer(HFBackend(models, default_dir, int(cfg.get("offloadChars", 4096))), size)


def shared_tokenizer(context: Any, params: dict[str, Any]) -> PromptTokenizer:
    """One tokenizer per EPP; the first plugin to ask creates it and schedules its preload at startup."""

    def make() -> PromptTokenizer:
        tok = build_tokenizer(params)
        context.background.append(tok.warm)
        return tok

    shared: PromptTokenizer = context.service(TOKENIZER_SERVICE, make)
    return shared


def shared_kv_service(context: Any, params: dict[str, Any]) -> KVCacheService:
    """The first plugin to ask creates the service (and registers its event pool); later ones reuse it."""

    def make() -> KVCacheService:
        svc = KVCacheService(KVCacheSettings.from_params(params))
        if svc.settings.events_enabled:
            context.endpoints.subscribe(svc.pool)
            context.background.append(svc.pool.run)
        return svc

    svc: KVCacheService = context.service(SERVICE_KEY, make)
    return svc


async def request_tokens(tok: PromptTokenizer, request: InferenceRequest) -> list[int] | None:
    got = request.data.get(TOKENS_KEY)
    if got is not None:
        return list(got)
    try:
        toks = await tok.tokenize(
            request.target_model,
            prompt=request.prompt if request.messages is None else None,
            messages=request.messages,
            chat_template_kwargs=request.body.get("chat_template_kwargs"),
        )
    except TokenizationError as e:
        log.info("request %s: not tokenized, no prefix score: %s", request.request_id, e)
        return None
    request.data[TOKENS_KEY] = toks
    return toks


@registry.register("tokenizer", "token-producer")
class TokenizerProducer(Plugin):
    """Tokenizes the request (vLLM-exact) into request.data["tokens"] for the plugins that need it."""

    def __init__(self, name: str, tokenizer: PromptTokenizer) -> None:
        super().__init__(name)
        self.tokenizer = tokenizer

    @classmethod
    def from_config(cls, name: str, parameters: dict[str, Any], context: Any) -> TokenizerProducer:
        return cls(name, shared_tokenizer(context, parameters or {}))

    async def prepare(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> None:
        await request_tokens(self.tokenizer, request)


@registry.register("precise-prefix-cache-producer")
class PrecisePrefixCacheProducer(Plugin):
    """Looks the request's blocks up in the KV index; after the pick, records it speculatively."""

    def __init__(
        self,
        name: str,
        service: KVCacheService,
        tokenizer: PromptTokenizer,
        speculative: bool = True,
        speculative_ttl: float = 2.0,
    ) -> None:
        super().__init__(name)
        self.service = service
        self.tokenizer = tokenizer
        self.speculative = speculative
        self.speculative_ttl = speculative_ttl

    @classmethod
    def from_config(cls, name: str, parameters: dict[str, Any], context: Any) -> Self:
        p = parameters or {}
        return cls(
            name,
            shared_kv_service(context, p),
            shared_tokenizer(context, p),
            speculative=bool(p.get("speculativeIndexing", True)),
            speculative_ttl=parse_duration(p.get("speculativeTTL"), 2.0),
        )

    async def prepare(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> None:
        request.data.pop(MATCH_KEY, None)
        request.data.pop(prefix_match_key(self.name), None)
        toks = await request_tokens(self.tokenizer, request)
        if not toks:
            return
        svc = self.service
        salt = request.body.get("cache_salt")
        keys = svc.request_keys(toks, request.target_model, endpoints, salt if isinstance(salt, str) else None)
        if not keys:
            return
        matches = await svc.match(keys, [ep.hostport for ep in endpoints])
        bs = svc.block_size_for(request.target_model, endpoints) or 0
        info = PreciseMatch(
            total_blocks=len(keys),
            block_size=bs,
            blocks={k: m.blocks for k, m in matches.items()},
            weighted={k: m.weighted for k, m in matches.items()},
            keys=keys,
        )
        request.data[MATCH_KEY] = info
        request.data[prefix_match_key(self.name)] = PrefixCacheMatchInfo(
            total_blocks=len(keys),
            block_size_tokens=bs,
            matches={ep.name: info.weighted[ep.hostport] for ep in endpoints if ep.hostport in info.weighted},
        )

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        info = request.data.get(MATCH_KEY)
        if not self.speculative or not isinstance(info, PreciseMatch):
            return
        seen: set[str] = set()
        for pr in result.profile_results.values():  # primary (decode) and, for P/D, the prefill pick
            if pr is not None and pr.targets and pr.targets[0].hostport not in seen:
                seen.add(pr.targets[0].hostport)
                self.service.speculate(info.keys, pr.targets[0].hostport, self.speculative_ttl)


def match_scores(info: PreciseMatch | None, endpoints: Sequence[Endpoint]) -> list[float]:
    """matched/total (tier-weighted), clipped to [0, 1]; 0 for endpoints without a cached prefix."""
    if info is None or info.total_blocks == 0:
        return [0.0] * len(endpoints)
    t = float(info.total_blocks)
    return [min(1.0, info.weighted.get(ep.hostport, 0.0) / t) for ep in endpoints]


@registry.register("precise-prefix-cache-scorer", "kvcache-aware-scorer")
class PrecisePrefixCacheScorer(PrecisePrefixCacheProducer):
    """Producer and scorer in one (llm-d's deprecated-but-common form); built by the producer's from_config."""

    def score(self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[float]:
        info = request.data.get(MATCH_KEY)
        return match_scores(info if isinstance(info, PreciseMatch) else None, endpoints)
