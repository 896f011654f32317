"""The precise-prefix-cache plugins, called directly: tokenize → keys → index → scores → speculative."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import msgspec
import pytest

from epp.datastore import Datastore
from epp.framework import registry
from epp.framework.context import PluginContext
from epp.framework.types import CycleState, Endpoint, InferenceRequest, ProfileResult, SchedulingResult
from epp.kvcache.events import decode_batch
from epp.kvcache.service import SERVICE_KEY, KVCacheService
from epp.tokenization.qwen import QWEN25_MODEL
from plugins.precise_prefix_cache import MATCH_KEY, PrecisePrefixCacheScorer

BS = 16
PARAMS: dict[str, Any] = {
    "tokenProcessorConfig": {"blockSize": BS, "hashSeed": "42"},
    "kvEventsConfig": {"topicFilter": "kv@", "concurrency": 2},
    "speculativeTTL": "2s",
}


def make(params: dict[str, Any] | None = None) -> tuple[PrecisePrefixCacheScorer, PluginContext, Datastore]:
    ds = Datastore()
    ctx = PluginContext(endpoints=ds)
    factory = registry.get_factory("precise-prefix-cache-scorer")
    assert factory is not None
    plugin = factory("kv", params or PARAMS, ctx)
    assert isinstance(plugin, PrecisePrefixCacheScorer)
    return plugin, ctx, ds


def chat_request(text: str, rid: str = "r1") -> InferenceRequest:
    msgs = [{"role": "system", "content": "You are a careful assistant."}, {"role": "user", "content": text}]
    return InferenceRequest(
        request_id=rid,
        path="/v1/chat/completions",
        api="chat",
        model=QWEN25_MODEL,
        target_model=QWEN25_MODEL,
        body={"model": QWEN25_MODEL, "messages": msgs},
        messages=msgs,
    )


def store_tokens(kv: Any, svc: KVCacheService, pod: str, tokens: list[int], n_blocks: int, base: int) -> None:
    """Apply a vLLM BlockStored (encoded by vLLM's own structs) for the first n_blocks of tokens."""
    ev = kv.BlockStored(
        block_hashes=[base + i for i in range(n_blocks)],
        parent_block_hash=None,
        token_ids=tokens[: n_blocks * BS],
        block_size=BS,
        lora_id=None,
        medium="GPU",
        lora_name=None,
    )
    payload = msgspec.msgpack.encode(kv.KVEventBatch(ts=time.time(), events=[ev]))
    svc.applier.apply(pod, QWEN25_MODEL, decode_batch(payload))


EPS = [Endpoint(f"pod{i}", f"10.0.0.{i}", 8000) for i in range(3)]
LONG = "Summarize the following report. " + " ".join(f"Section {i}: the quarterly numbers improved." for i in range(60))


async def test_scores_follow_the_longest_cached_prefix(vllm_kv: Any) -> None:
    plugin, ctx, _ = make()
    svc = ctx.services[SERVICE_KEY]
    req = chat_request(LONG)
    await plugin.prepare(req, EPS)  # tokenizes; nothing cached yet
    toks = req.data["tokens"]
    n = len(toks) // BS
    assert n >= 10
    assert plugin.score(CycleState(), req, EPS) == [0.0, 0.0, 0.0]
    store_tokens(vllm_kv, svc, EPS[1].hostport, toks, n, 1000)  # pod1: the whole prompt
    store_tokens(vllm_kv, svc, EPS[2].hostport, toks, n // 2, 2000)  # pod2: the first half
    req2 = chat_request(LONG, "r2")
    await plugin.prepare(req2, EPS)
    s = plugin.score(CycleState(), req2, EPS)
    assert s[0] == 0.0 and s[1] == pytest.approx(1.0) and s[2] == pytest.approx((n // 2) / n)
    # a different user turn shares only the system prompt + start of the template
    other = chat_request("Something else entirely, unrelated to any report.", "r3")
    await plugin.prepare(other, EPS)
    assert max(plugin.score(CycleState(), other, EPS)) < 0.5


async def test_speculative_entry_routes_a_burst_then_expires() -> None:
    plugin, _ctx, _ = make({**PARAMS, "speculativeTTL": "200ms"})
    req = chat_request(LONG)
    await plugin.prepare(req, EPS)
    assert plugin.score(CycleState(), req, EPS) == [0.0, 0.0, 0.0]
    plugin.pre_request(req, SchedulingResult({"default": ProfileResult([EPS[2]])}, "default"))
    burst = chat_request(LONG, "r2")
    await plugin.prepare(burst, EPS)
    assert plugin.score(CycleState(), burst, EPS) == [0.0, 0.0, 1.0]
    await asyncio.sleep(0.25)
    later = chat_request(LONG, "r3")
    await plugin.prepare(later, EPS)
    assert plugin.score(CycleState(), later, EPS) == [0.0, 0.0, 0.0]


async def test_cache_salt_isolates_and_tiers_weigh(vllm_kv: Any) -> None:
    plugin, ctx, _ = make({**PARAMS, "indexerConfig": {"kvCacheBackendConfigs": [{"name": "cpu", "weight": 0.5}]}})
    svc = ctx.services[SERVICE_KEY]
    req = chat_request(LONG)
    await plugin.prepare(req, EPS)
    toks = req.data["tokens"]
    n = len(toks) // BS
    store_tokens(vllm_kv, svc, EPS[0].hostport, toks, n, 1000)
    # the same blocks offloaded to CPU on pod1 (a store without tokens = tier update of known blocks)
    store_tokens(vllm_kv, svc, EPS[1].hostport, toks, n, 3000)
    svc.index.evict(range(3000, 3000 + n), EPS[1].hostport, 0)  # gone from pod1's GPU...
    assert svc.index.request_key(EPS[1].hostport, 3000) is None
    store_tokens(vllm_kv, svc, EPS[1].hostport, toks, n, 4000)
    ev_keys = [svc.index.request_key(EPS[1].hostport, 4000 + i) for i in range(n)]
    svc.index.add(None, [k for k in ev_keys if k is not None], EPS[1].hostport, 1)  # ...and kept on its CPU
    svc.index.evict(range(4000, 4000 + n), EPS[1].hostport, 0)
    req2 = chat_request(LONG, "r2")
    await plugin.prepare(req2, EPS)
    assert plugin.score(CycleState(), req2, EPS) == [pytest.approx(1.0), pytest.approx(0.5), 0.0]
    salted = chat_request(LONG, "r3")
    salted.body["cache_salt"] = "tenant-a"
    await plugin.prepare(salted, EPS)
    assert plugin.score(CycleState(), salted, EPS) == [0.0, 0.0, 0.0]


async def test_untokenizable_request_scores_zero_without_error() -> None:
    plugin, _, _ = make()
    req = InferenceRequest("r", "/v1/completions", "completions", "m", "unknown-model", body={}, prompt=None)
    await plugin.prepare(req, EPS)
    assert MATCH_KEY not in req.data
    assert plugin.score(CycleState(), req, EPS) == [0.0, 0.0, 0.0]


async def test_plugin_registers_pool_and_follows_datastore() -> None:
    plugin, ctx, ds = make()
    # one event-pool task and one tokenizer preload, whatever number of plugins share them
    assert ctx.background == [plugin.service.pool.run, plugin.tokenizer.warm]
    again = registry.get_factory("precise-prefix-cache-producer")
    assert again is not None
    producer = again("p", PARAMS, ctx)
    assert producer.service is plugin.service  # one shared index and pool
    assert len(ctx.background) == 2
    task = asyncio.create_task(ctx.background[0]())
    try:
        await plugin.service.pool.started()
        ds.upsert(EPS[0])
        assert EPS[0].hostport in plugin.service.pool._subs
        ds.remove(EPS[0].name)
        assert EPS[0].hostport not in plugin.service.pool._subs
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_producer_feeds_the_generic_prefix_cache_scorer(vllm_kv: Any) -> None:
    """llm-d's current pipeline: precise-prefix-cache-producer → prefix-cache-scorer(prefixMatchInfoProducerName)."""
    ds = Datastore()
    ctx = PluginContext(endpoints=ds)
    producer = registry.get_factory("precise-prefix-cache-producer")("precise", PARAMS, ctx)  # type: ignore[misc]
    scorer = registry.get_factory("prefix-cache-scorer")("pcs", {"prefixMatchInfoProducerName": "precise"}, ctx)  # type: ignore[misc]
    req = chat_request(LONG)
    await producer.prepare(req, EPS)
    toks = req.data["tokens"]
    n = len(toks) // BS
    store_tokens(vllm_kv, ctx.services[SERVICE_KEY], EPS[0].hostport, toks, n // 4, 100)
    req2 = chat_request(LONG, "r2")
    await producer.prepare(req2, EPS)
    s = scorer.score(CycleState(), req2, EPS)
    assert s == [pytest.approx((n // 4) / n), 0.0, 0.0]


async def test_block_size_learned_from_scraped_cache_config() -> None:
    plugin, ctx, _ = make({"kvEventsConfig": {"enabled": False}})
    svc = ctx.services[SERVICE_KEY]
    req = chat_request(LONG)
    await plugin.prepare(req, EPS)  # nothing known yet: no keys, no score
    assert MATCH_KEY not in req.data and svc.block_size_for(QWEN25_MODEL) is None
    eps = [Endpoint("m0", "10.0.0.9", 8000)]
    eps[0].metrics.cache_block_size = 32  # vllm:cache_config_info{block_size="32"}
    req2 = chat_request(LONG, "r2")
    await plugin.prepare(req2, eps)
    assert req2.data[MATCH_KEY].block_size == 32
    assert req2.data[MATCH_KEY].total_blocks == len(req2.data["tokens"]) // 32
    assert ctx.background == [plugin.tokenizer.warm]  # events disabled: no pool task, only the tokenizer preload


def test_token_producer_llmd_style_vllm_backend() -> None:
    from epp.tokenization.prompt import HTTPBackend
    from plugins.precise_prefix_cache import build_tokenizer

    tok = build_tokenizer({"vllm": {"url": "http://10.0.0.5:8000", "timeout": "3s"}})
    assert isinstance(tok.backend, HTTPBackend)
    assert tok.backend.url == "http://10.0.0.5:8000/tokenize" and tok.backend.timeout == 3.0
