"""The approximate prefix index: chained block hashes, greedy matching, bounded per-endpoint LRU."""

from __future__ import annotations

import asyncio

import pytest

from epp.datalayer.datastore import Datastore
from epp.framework import (
    ApiKind,
    Endpoint,
    InferenceRequest,
    PluginConfigError,
    ProfileResult,
    SchedulingResult,
)
from epp.plugins.contracts.prompt import request_text
from epp.plugins.producers.approx_prefix_cache_producer import (
    ApproxPrefixCacheProducer,
    PrefixIndex,
    block_hashes,
)
from epp.wiring import plugin_context
from tests.helpers import build


def chat(text: str, model: str = "m", salt: str | None = None) -> InferenceRequest:
    msgs = [{"role": "user", "content": text}]
    body: dict[str, object] = {"model": model, "messages": msgs}
    if salt:
        body["cache_salt"] = salt
    return InferenceRequest("r", "/v1/chat/completions", ApiKind.CHAT, model, model, body, messages=msgs)


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
    comp = InferenceRequest("r", "/v1/completions", ApiKind.COMPLETIONS, "m", "m", {"prompt": "hi"}, prompt="hi")
    assert request_text(comp) == "hi"
    emb = InferenceRequest("r", "/v1/embeddings", ApiKind.EMBEDDINGS, "m", "m", {"input": ["a", "b"]})
    assert request_text(emb) == '["a","b"]'
    resp = InferenceRequest(
        "r", "/v1/responses", ApiKind.RESPONSES, "m", "m", {"input": "q", "instructions": "be nice"}
    )
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


def _reference_match(holders: dict[int, set[str]], hashes: list[int]) -> dict[str, float]:
    """The walk block by block, as GIE describes it: each endpoint's run of hits from the first block."""
    counts: dict[str, float] = {}
    active: set[str] | None = None
    depth = 0
    for h in hashes:
        eps = holders.get(h, set())
        now = set(eps) if active is None else active & eps
        for name in (active or set()) - now:
            counts[name] = depth
        active = now
        if not active:
            return counts
        depth += 1
    for name in active or ():
        counts[name] = depth
    return counts


def test_index_match_equals_the_block_by_block_walk() -> None:
    """The C-level walk finds the same runs as the plain one, with holes, drop-outs and eviction in play."""
    import random

    rng = random.Random(7)
    for trial in range(300):
        idx = PrefixIndex(capacity=rng.choice([5, 12, 40]))
        chains = [[rng.randrange(1 << 40) for _ in range(12)] for _ in range(3)]
        for _ in range(rng.randrange(1, 25)):
            chain = rng.choice(chains)
            if rng.random() < 0.05:
                idx.remove_endpoint(rng.choice("abcdef"))
            idx.add(rng.choice("abcdef"), chain[: rng.randrange(1, 13)])
        # the reverse map is exactly the LRUs' contents (the shared frozen sets never go stale)
        truth: dict[int, set[str]] = {}
        for ep, lru in idx._lru.items():
            for h in lru:
                truth.setdefault(h, set()).add(ep)
        assert {h: set(s) for h, s in idx._holders.items()} == truth, trial
        for chain in chains:
            for cut in (1, 5, 12):
                q = chain[:cut] + [rng.randrange(1 << 40)] * rng.randrange(2)
                assert idx.match(q) == _reference_match(truth, q), (trial, q)
    assert idx.match([]) == {}


def test_index_blocks_added_together_share_one_holder_set() -> None:
    """What keeps `match` cheap with many holders: a chain added by the same endpoints has one holder set object,
    and evicting or removing an endpoint keeps the chain's blocks sharing one."""
    idx = PrefixIndex(capacity=100)
    chain = list(range(1, 41))
    for ep in ("a", "b", "c"):
        idx.add(ep, chain)
    assert len({id(idx._holders[h]) for h in chain}) == 1 and idx._holders[1] == {"a", "b", "c"}
    idx.add("d", chain[:20])
    assert len({id(idx._holders[h]) for h in chain[:20]}) == 1 and idx._holders[1] == {"a", "b", "c", "d"}
    assert len({id(idx._holders[h]) for h in chain[20:]}) == 1 and idx._holders[39] == {"a", "b", "c"}
    idx.add("a", list(range(1000, 1070)))  # capacity 100: a's 10 oldest blocks go
    assert len({id(idx._holders[h]) for h in chain[:10]}) == 1 and idx._holders[1] == {"b", "c", "d"}
    idx.remove_endpoint("b")
    assert len({id(idx._holders[h]) for h in chain[:10]}) == 1 and idx._holders[1] == {"c", "d"}
    assert idx.match(chain) == {"c": 40, "d": 20}


def test_index_add_keeps_lru_order_when_some_hashes_are_new() -> None:
    """A request whose prefix is held and whose tail is new: every hash ends up touched in order, so eviction
    takes the oldest first as before."""
    idx = PrefixIndex(capacity=4)
    idx.add("a", [1, 2])
    idx.add("a", [9])
    idx.add("a", [1, 2, 3])  # 1 and 2 held, 3 new: order now 9, 1, 2, 3
    idx.add("a", [4])  # evicts 9
    assert idx.match([9]) == {} and idx.match([1, 2, 3, 4]) == {"a": 4}
    idx.add("a", [5])  # evicts 1, the oldest
    assert idx.match([1]) == {} and idx.match([2]) == {"a": 1}


async def test_repeated_prompt_hashes_come_from_the_memo_and_it_is_bounded() -> None:
    from epp.plugins.producers import approx_prefix_cache_producer as mod

    p = ApproxPrefixCacheProducer("approx", block_size_tokens=4)
    r1, r2 = chat("y" * 200), chat("y" * 200)
    first = p.hashes_for(r1, 4)
    assert p.hashes_for(r2, 4) is first  # the memo's list, not a second hashing
    assert p.hashes_for(chat("y" * 200, salt="s"), 4) != first  # the seed is part of the key
    for i in range(mod.HASH_MEMO_SIZE + 10):
        p.hashes_for(chat(f"{i:04d}" * 50), 4)
    assert len(p._memo) == mod.HASH_MEMO_SIZE
    long = chat("z" * (mod.HASH_MEMO_CHARS + 10))
    p.max_blocks = 10**6
    assert p.hashes_for(long, 4) and all(len(k[2]) <= mod.HASH_MEMO_CHARS for k in p._memo)
