"""The approximate prefix index: chained block hashes, greedy matching, bounded per-endpoint LRU."""

from __future__ import annotations

import asyncio

import pytest

from epp.datalayer.datastore import Datastore
from epp.framework import (
    Endpoint,
    InferenceRequest,
    PluginConfigError,
    ProfileResult,
    SchedulingResult,
)
from epp.plugins.producers.approx_prefix_cache_producer import (
    ApproxPrefixCacheProducer,
    PrefixIndex,
    block_hashes,
    request_text,
)
from epp.wiring import plugin_context
from tests.helpers import build


def chat(text: str, model: str = "m", salt: str | None = None) -> InferenceRequest:
    msgs = [{"role": "user", "content": text}]
    body: dict[str, object] = {"model": model, "messages": msgs}
    if salt:
        body["cache_salt"] = salt
    return InferenceRequest("r", "/v1/chat/completions", "chat", model, model, body, messages=msgs)


def test_block_hashes_chain_and_partial_block() -> None:
    assert block_hashes("abc", 4, 10, 1) == []
    h = block_hashes("aaaabbbbcc", 4, 10, 1)
    assert len(h) == 3  # trailing partial block is hashed too
    assert block_hashes("aaaabbbbXX", 4, 10, 1)[:2] == h[:2]
    # chained: same second block after a different first block hashes differently
    assert block_hashes("zzzzbbbb", 4, 10, 1)[1] != h[1]
    assert block_hashes("aaaabbbbcc", 4, 2, 1) == h[:2]  # truncated to maxBlocks
    assert block_hashes("aaaabbbb", 4, 10, 2)[0] != h[0]  # the seed (model, salt) matters


def test_index_greedy_match_and_lru_eviction() -> None:
    idx = PrefixIndex(capacity=3)
    idx.add("a", [1, 2, 3])
    idx.add("b", [1, 2])
    assert idx.match([1, 2, 3, 4]) == {"a": 3, "b": 2}
    assert idx.match([9, 1]) == {}  # stops at the first hash nobody holds
    idx.add("a", [4])  # capacity 3: evicts a's oldest (1)
    assert idx.match([1, 2, 3, 4]) == {"b": 2}  # a lost its first block: no usable prefix
    idx.add("c", [1, 5])
    assert idx.match([1, 2, 3]) == {"b": 2, "c": 1}
    assert idx.size("a") == 3
    idx.remove_endpoint("b")
    assert idx.match([1, 2]) == {"c": 1} and idx.size() == 5


async def test_producer_records_pick_and_matches_next_request() -> None:
    ds = Datastore()
    a, b = Endpoint("a", "10.0.0.1", 8000), Endpoint("b", "10.0.0.2", 8000)
    ds.replace_all([a, b])
    ctx = plugin_context(ds)
    p = build(ApproxPrefixCacheProducer, name="approx", parameters={"blockSizeTokens": 4}, ctx=ctx)
    text = "x" * 160  # 10 blocks of 16 chars
    r1 = chat(text)
    await p.prepare(r1, [a, b])
    info = r1.data.require(p.key)
    assert info.total_blocks > 0 and info.matches == {}
    p.pre_request(r1, SchedulingResult({"default": ProfileResult([b])}, "default"))
    await asyncio.sleep(0)  # recording runs right after the decision
    r2 = chat(text + " and more")
    await p.prepare(r2, [a, b])
    info2 = r2.data.require(p.key)
    assert info2.matches.get("b", 0) >= info.total_blocks - 1
    assert "a" not in info2.matches
    # other model or salt: no match
    r3 = chat(text, model="other")
    await p.prepare(r3, [a, b])
    assert r3.data.require(p.key).matches == {}
    r4 = chat(text, salt="tenant-1")
    await p.prepare(r4, [a, b])
    assert r4.data.require(p.key).matches == {}
    # a relabel in place (an update, not remove + add) keeps b's entries
    ds.upsert(Endpoint("b", "10.0.0.2", 8000, labels={"rev": "2"}))
    r_relabelled = chat(text + " and more")
    await p.prepare(r_relabelled, [a, b])
    assert r_relabelled.data.require(p.key).matches == info2.matches
    # the endpoint leaves the pool: its entries go
    ds.remove("b")
    r5 = chat(text)
    await p.prepare(r5, [a])
    assert r5.data.require(p.key).matches == {}


def test_request_text_per_api() -> None:
    comp = InferenceRequest("r", "/v1/completions", "completions", "m", "m", {"prompt": "hi"}, prompt="hi")
    assert request_text(comp) == "hi"
    emb = InferenceRequest("r", "/v1/embeddings", "embeddings", "m", "m", {"input": ["a", "b"]})
    assert request_text(emb) == '["a","b"]'
    resp = InferenceRequest("r", "/v1/responses", "responses", "m", "m", {"input": "q", "instructions": "be nice"})
    assert request_text(resp) == '["be nice",null,"q"]'
    assert request_text(chat("hello")).endswith("hello\x01")


def test_producer_parameters() -> None:
    p = build(ApproxPrefixCacheProducer, name="p", parameters={"blockSizeTokens": 8, "maxPrefixTokensToMatch": 800})
    assert p.block_size_tokens == 8 and p.max_blocks == 100
    legacy = build(ApproxPrefixCacheProducer, name="p", parameters={"hashBlockSize": 64})
    assert legacy.block_size_tokens == 16
    # llm-d-router: the deprecated blockSize maps to blockSizeTokens (with a warning) unless that is set
    assert build(ApproxPrefixCacheProducer, name="p", parameters={"blockSize": 64}).block_size_tokens == 64
    both = build(ApproxPrefixCacheProducer, name="p", parameters={"blockSize": 64, "blockSizeTokens": 32})
    assert both.block_size_tokens == 32
    with pytest.raises(PluginConfigError, match="lruCapacityPerServer"):
        build(ApproxPrefixCacheProducer, name="p", parameters={"lruCapacityPerServer": 0})
