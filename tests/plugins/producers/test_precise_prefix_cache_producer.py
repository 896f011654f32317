"""The precise-prefix-cache plugins, built by the config builder and called directly: token-producer → keys → index
→ scores → speculative entries."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from typing import Any

import msgspec
import pytest
import yaml

from epp.config import parse_config
from epp.datalayer.datastore import Datastore
from epp.framework import (
    TOKENIZED_PROMPT,
    ApiKind,
    CountedReport,
    CycleState,
    Endpoint,
    InferenceRequest,
    Metrics,
    ProfileResult,
    SchedulingResult,
    Usage,
)
from epp.kvcache.events import decode_batch
from epp.kvcache.service import KVCacheService
from epp.plugins.producers.precise_prefix_cache_producer import PrecisePrefixCacheProducer
from epp.plugins.producers.token_producer import TokenProducer
from epp.plugins.scorers.precise_prefix_cache_scorer import PrecisePrefixCacheScorer
from epp.plugins.scorers.prefix_cache_scorer import PrefixCacheScorer
from epp.requestcontrol.pipeline import Pipeline
from epp.tokenization.prompt import PromptTokenizer
from epp.tokenization.qwen import QWEN25_MODEL
from epp.wiring import build_pipeline, plugin_context
from epp.wiring.services import EppServices

BS = 16
PARAMS: dict[str, Any] = {
    "tokenProcessorConfig": {"blockSize": BS, "hashSeed": "42"},
    "kvEventsConfig": {"topicFilter": "kv@", "concurrency": 2},
    "speculativeTTL": "2s",
}


class Rig:
    """A pipeline built from `plugins` (the builder adds the token-producer the precise plugins need)."""

    def __init__(self, plugins: list[dict[str, Any]]) -> None:
        self.ds = Datastore()
        self.ctx = plugin_context(self.ds)
        self.pipeline: Pipeline = build_pipeline(parse_config(yaml.safe_dump({"plugins": plugins})), self.ctx)
        assert isinstance(self.ctx.services, EppServices) and self.ctx.services.kv is not None
        self.svc: KVCacheService = self.ctx.services.kv

    async def prepare(self, request: InferenceRequest, endpoints: list[Endpoint]) -> None:
        for producer in self.pipeline.producers:
            await producer.prepare(request, endpoints)


def make(params: dict[str, Any] | None = None) -> tuple[PrecisePrefixCacheScorer, Rig]:
    rig = Rig([{"type": "precise-prefix-cache-scorer", "name": "kv", "parameters": params or PARAMS}])
    plugin = rig.pipeline.plugins["kv"]
    assert isinstance(plugin, PrecisePrefixCacheScorer)
    return plugin, rig


def tokens(req: InferenceRequest) -> list[int]:
    return req.data.require(TOKENIZED_PROMPT).token_ids


def chat_request(text: str, rid: str = "r1") -> InferenceRequest:
    msgs = [{"role": "system", "content": "You are a careful assistant."}, {"role": "user", "content": text}]
    return InferenceRequest(
        request_id=rid,
        path="/v1/chat/completions",
        api=ApiKind.CHAT,
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
    plugin, rig = make()
    svc = rig.svc
    req = chat_request(LONG)
    await rig.prepare(req, EPS)  # tokenizes; nothing cached yet
    toks = tokens(req)
    n = len(toks) // BS
    assert n >= 10
    assert plugin.score(CycleState(), req, EPS) == [0.0, 0.0, 0.0]
    store_tokens(vllm_kv, svc, EPS[1].hostport, toks, n, 1000)  # pod1: the whole prompt
    store_tokens(vllm_kv, svc, EPS[2].hostport, toks, n // 2, 2000)  # pod2: the first half
    req2 = chat_request(LONG, "r2")
    await rig.prepare(req2, EPS)
    s = plugin.score(CycleState(), req2, EPS)
    assert s[0] == 0.0 and s[1] == pytest.approx(1.0) and s[2] == pytest.approx((n // 2) / n)
    # a different user turn shares only the system prompt + start of the template
    other = chat_request("Something else entirely, unrelated to any report.", "r3")
    await rig.prepare(other, EPS)
    assert max(plugin.score(CycleState(), other, EPS)) < 0.5


async def test_speculative_entry_routes_a_burst_then_expires() -> None:
    plugin, rig = make({**PARAMS, "speculativeTTL": "200ms"})
    req = chat_request(LONG)
    await rig.prepare(req, EPS)
    assert plugin.score(CycleState(), req, EPS) == [0.0, 0.0, 0.0]
    plugin.pre_request(req, SchedulingResult({"default": ProfileResult([EPS[2]])}, "default"))
    burst = chat_request(LONG, "r2")
    await rig.prepare(burst, EPS)
    assert plugin.score(CycleState(), burst, EPS) == [0.0, 0.0, 1.0]
    await asyncio.sleep(0.25)
    later = chat_request(LONG, "r3")
    await rig.prepare(later, EPS)
    assert plugin.score(CycleState(), later, EPS) == [0.0, 0.0, 0.0]


async def test_speculative_hold_keeps_a_queued_pick_past_its_ttl_until_the_response_ends() -> None:
    """speculativeHold: the pod whose prefill of this prompt may still be queued keeps matching past speculativeTTL,
    until the request ends (then the TTL runs); without it the entry lapses on the TTL as llm-d's does."""
    plugin, rig = make({**PARAMS, "speculativeTTL": "150ms", "speculativeHold": "30s"})
    req = chat_request(LONG)
    await rig.prepare(req, EPS)
    plugin.pre_request(req, SchedulingResult({"default": ProfileResult([EPS[2]])}, "default"))
    await asyncio.sleep(0.2)
    queued = chat_request(LONG, "r2")  # arrives while the first one waits in pod2's queue, past the TTL
    await rig.prepare(queued, EPS)
    assert plugin.score(CycleState(), queued, EPS) == [0.0, 0.0, 1.0]
    assert plugin.speculative_hold == 30.0
    plugin.response_complete(req, EPS[2], None)
    await asyncio.sleep(0.2)
    later = chat_request(LONG, "r3")
    await rig.prepare(later, EPS)
    assert plugin.score(CycleState(), later, EPS) == [0.0, 0.0, 0.0]


async def test_cache_salt_isolates_and_tiers_weigh(vllm_kv: Any) -> None:
    plugin, rig = make({**PARAMS, "indexerConfig": {"kvCacheBackendConfigs": [{"name": "cpu", "weight": 0.5}]}})
    svc = rig.svc
    req = chat_request(LONG)
    await rig.prepare(req, EPS)
    toks = tokens(req)
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
    await rig.prepare(req2, EPS)
    assert plugin.score(CycleState(), req2, EPS) == [pytest.approx(1.0), pytest.approx(0.5), 0.0]
    salted = chat_request(LONG, "r3")
    salted.body["cache_salt"] = "tenant-a"
    await rig.prepare(salted, EPS)
    assert plugin.score(CycleState(), salted, EPS) == [0.0, 0.0, 0.0]


async def test_untokenizable_request_scores_zero_without_error() -> None:
    plugin, rig = make()
    req = InferenceRequest("r", "/v1/completions", ApiKind.COMPLETIONS, "m", "unknown-model", body={}, prompt=None)
    await rig.prepare(req, EPS)
    assert TOKENIZED_PROMPT not in req.data and plugin.match_key not in req.data
    assert plugin.score(CycleState(), req, EPS) == [0.0, 0.0, 0.0]


async def test_plugin_registers_pool_and_follows_datastore() -> None:
    rig = Rig(
        [
            {"type": "precise-prefix-cache-scorer", "name": "kv", "parameters": PARAMS},
            {"type": "precise-prefix-cache-producer", "name": "p", "parameters": PARAMS},
        ]
    )
    kv, producer = rig.pipeline.plugins["kv"], rig.pipeline.plugins["p"]
    assert isinstance(kv, PrecisePrefixCacheScorer) and isinstance(producer, PrecisePrefixCacheProducer)
    assert producer.index is kv.index is rig.svc  # one shared index and event pool
    tok = rig.pipeline.plugins["token-producer"]  # added once, for both
    assert isinstance(tok, TokenProducer) and isinstance(tok.tokenizer, PromptTokenizer)
    assert [p.name for p in rig.pipeline.producers] == ["token-producer", "kv", "p"]
    # one event-pool task and one tokenizer preload, whatever number of plugins share them
    assert rig.ctx.background == [rig.svc.pool.run]
    assert rig.ctx.services.warmups == [tok.tokenizer.warm]  # type: ignore[attr-defined]
    task = asyncio.create_task(rig.ctx.background[0]())
    try:
        await rig.svc.pool.started()
        rig.ds.upsert(EPS[0])
        assert EPS[0].hostport in rig.svc.pool.subscriptions._subs
        rig.ds.remove(EPS[0].name)
        assert EPS[0].hostport not in rig.svc.pool.subscriptions._subs
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_producer_feeds_the_generic_prefix_cache_scorer(vllm_kv: Any) -> None:
    """llm-d's current pipeline: precise-prefix-cache-producer → prefix-cache-scorer(prefixMatchInfoProducerName)."""
    rig = Rig(
        [
            {"type": "precise-prefix-cache-producer", "name": "precise", "parameters": PARAMS},
            {"type": "prefix-cache-scorer", "name": "pcs", "parameters": {"prefixMatchInfoProducerName": "precise"}},
        ]
    )
    scorer = rig.pipeline.plugins["pcs"]
    assert isinstance(scorer, PrefixCacheScorer)
    req = chat_request(LONG)
    await rig.prepare(req, EPS)
    toks = tokens(req)
    n = len(toks) // BS
    store_tokens(vllm_kv, rig.svc, EPS[0].hostport, toks, n // 4, 100)
    req2 = chat_request(LONG, "r2")
    await rig.prepare(req2, EPS)
    s = scorer.score(CycleState(), req2, EPS)
    assert s == [pytest.approx((n // 4) / n), 0.0, 0.0]


async def test_block_size_learned_from_scraped_cache_config() -> None:
    plugin, rig = make({"kvEventsConfig": {"enabled": False}})
    svc = rig.svc
    req = chat_request(LONG)
    await rig.prepare(req, EPS)  # nothing known yet: no keys, no score
    assert plugin.match_key not in req.data and svc.block_size_for(QWEN25_MODEL) is None
    eps = [Endpoint("m0", "10.0.0.9", 8000)]
    eps[0].metrics.cache_block_size = 32  # vllm:cache_config_info{block_size="32"}
    req2 = chat_request(LONG, "r2")
    await rig.prepare(req2, eps)
    match = req2.data.require(plugin.match_key)
    assert match.block_size == 32
    assert match.total_blocks == len(tokens(req2)) // 32
    tok = rig.pipeline.plugins["token-producer"]
    assert isinstance(tok, TokenProducer) and isinstance(tok.tokenizer, PromptTokenizer)
    assert rig.ctx.background == []  # events disabled: no pool task
    assert rig.ctx.services.warmups == [tok.tokenizer.warm]  # type: ignore[attr-defined]  # the tokenizer preload


def test_token_producer_llmd_style_vllm_backend() -> None:
    from epp.framework import Params
    from epp.tokenization.factory import tokenizer_from_params
    from epp.tokenization.prompt import HTTPBackend

    tok = tokenizer_from_params(Params("t", {"vllm": {"url": "http://10.0.0.5:8000", "timeout": "3s"}}))
    assert isinstance(tok.backend, HTTPBackend)
    assert tok.backend.url == "http://10.0.0.5:8000/tokenize" and tok.backend.timeout == 3.0


async def test_delivered_hits_loop_reports_only_what_the_engine_reported(vllm_kv: Any) -> None:
    plugin, rig = make({**PARAMS, "speculativeIndexing": False, "deliveredHitsConfig": {"window": 4}})
    req = chat_request(LONG)
    await rig.prepare(req, EPS)
    toks = tokens(req)
    store_tokens(vllm_kv, rig.svc, EPS[1].hostport, toks, len(toks) // BS, 7000)  # the index: pod1 has it all
    reports: list[tuple[str, int, int]] = []
    real = rig.svc.report_delivered

    def spy(pod: str, keys: Sequence[int], pred: int, deliv: int, bs: int, prompt: int) -> None:
        reports.append((pod, pred, deliv))
        real(pod, keys, pred, deliv, bs, prompt)

    rig.svc.report_delivered = spy  # type: ignore[method-assign,assignment]
    for i in range(4):
        r = chat_request(LONG, f"q{i}")
        await rig.prepare(r, EPS)
        plugin.response_complete(r, EPS[1], None)  # no usage (stream without include_usage): nothing to compare
        plugin.response_complete(r, EPS[1], Usage(prompt_tokens=len(toks)))  # cached_tokens never reported
        plugin.response_complete(
            r, EPS[1], Usage(prompt_tokens=len(toks), cached_tokens=0, cached_tokens_reported=True)
        )
    assert reports == [(EPS[1].hostport, len(toks) // BS, 0)] * 4
    # four requests in a row got nothing of the predicted prefix: pod1's entries are cleared
    again = chat_request(LONG, "after")
    await rig.prepare(again, EPS)
    assert plugin.score(CycleState(), again, EPS) == [0.0, 0.0, 0.0]


def reported_pods(rig: Rig) -> list[str]:
    """The pods the producer reports delivered hits for, in order (the reports still reach the service)."""
    reports: list[str] = []
    real = rig.svc.report_delivered

    def spy(pod: str, keys: Sequence[int], pred: int, deliv: int, bs: int, prompt: int) -> None:
        reports.append(pod)
        real(pod, keys, pred, deliv, bs, prompt)

    rig.svc.report_delivered = spy  # type: ignore[method-assign,assignment]
    return reports


async def test_delivered_hits_loop_ignores_hits_predicted_from_our_own_speculation() -> None:
    plugin, rig = make({**PARAMS, "speculativeTTL": "2s", "deliveredHitsConfig": {"window": 2}})
    reports = reported_pods(rig)
    first = chat_request(LONG, "burst-0")
    await rig.prepare(first, EPS)
    plugin.pre_request(first, SchedulingResult({"default": ProfileResult([EPS[2]])}, "default"))
    n = len(tokens(first))
    for i in range(1, 4):  # the rest of the burst: the index's hit on pod2 is our speculation, the engine has none
        r = chat_request(LONG, f"burst-{i}")
        await rig.prepare(r, EPS)
        assert plugin.score(CycleState(), r, EPS) == [0.0, 0.0, 1.0]
        plugin.response_complete(r, EPS[2], Usage(prompt_tokens=n, cached_tokens=0, cached_tokens_reported=True))
    assert reports == []  # not counted against pod2: no resync from a burst
    plugin.response_complete(first, EPS[2], Usage(prompt_tokens=n, cached_tokens=0, cached_tokens_reported=True))
    assert reports == [EPS[2].hostport]  # the first request's own match was not speculative


async def test_a_speculation_for_another_prompt_with_the_same_first_block_does_not_hide_an_event_backed_match(
    vllm_kv: Any,
) -> None:
    """A pod counts as speculated for the closed loop only when its match rests on a speculative entry (its deepest
    matched block held only speculatively), not whenever any prompt sharing the request's first block was just sent
    there: with a shared system prompt that hid every busy pod from the loop."""
    plugin, rig = make({**PARAMS, "speculativeTTL": "2s", "deliveredHitsConfig": {"window": 2}})
    reports = reported_pods(rig)
    held = chat_request(LONG, "held")
    await rig.prepare(held, EPS)
    toks = tokens(held)
    store_tokens(vllm_kv, rig.svc, EPS[1].hostport, toks, len(toks) // BS, 1000)  # pod1's events: all of it
    other_text = "Summarize the following report. " + "None of its sections, something else entirely. " * 8
    other = chat_request(other_text, "other")
    await rig.prepare(other, EPS)
    assert other.data.require(plugin.match_key).keys[0] == held.data.require(plugin.match_key).keys[0]
    plugin.pre_request(other, SchedulingResult({"default": ProfileResult([EPS[1]])}, "default"))  # speculated there
    again = chat_request(LONG, "again")
    await rig.prepare(again, EPS)
    assert again.data.require(plugin.match_key).speculated == set()
    n = len(toks)
    plugin.response_complete(again, EPS[1], Usage(prompt_tokens=n, cached_tokens=n, cached_tokens_reported=True))
    assert reports == [EPS[1].hostport]
    burst = chat_request(other_text, "other-2")  # the other prompt's own burst: its match on pod1 is the speculation
    await rig.prepare(burst, EPS)
    assert burst.data.require(plugin.match_key).speculated == {EPS[1].hostport}
    plugin.response_complete(burst, EPS[1], Usage(prompt_tokens=n, cached_tokens=0, cached_tokens_reported=True))
    assert reports == [EPS[1].hostport]


async def test_delivered_hits_loop_reads_the_engine_counters_when_usage_has_no_cached_tokens(vllm_kv: Any) -> None:
    plugin, rig = make({**PARAMS, "speculativeIndexing": False, "deliveredHitsConfig": {"window": 4}})
    eps = [Endpoint(f"pod{i}", f"10.0.1.{i}", 8000) for i in range(3)]
    req = chat_request(LONG)
    await rig.prepare(req, eps)
    toks = tokens(req)
    store_tokens(vllm_kv, rig.svc, eps[1].hostport, toks, len(toks) // BS, 7100)  # the index: pod1 has it all
    hits, queries = 0.0, 0.0
    for i in range(5):  # a scrape between responses; the engine served every prompt uncached
        eps[1].metrics = Metrics(prefix_cache_hits=hits, prefix_cache_queries=queries, update_time=time.monotonic())
        r = chat_request(LONG, f"q{i}")
        await rig.prepare(r, eps)
        assert plugin.score(CycleState(), r, eps) == [0.0, 1.0, 0.0], i
        usage = None if i % 2 else Usage(prompt_tokens=len(toks))  # no usage / usage without cached_tokens
        plugin.response_complete(r, eps[1], usage)
        queries += len(toks)
    # four closed intervals, nothing delivered of the predicted prefix: pod1's entries are cleared
    again = chat_request(LONG, "after")
    await rig.prepare(again, eps)
    assert plugin.score(CycleState(), again, eps) == [0.0, 0.0, 0.0]


async def test_multimodal_items_key_the_blocks_as_the_engines_events_do(vllm_kv: Any) -> None:
    """A pre-tokenized request's mm features (/inference/v1/generate `features`) go into the block keys' extra keys:
    it matches a BlockStored whose `extra_keys` carry the same item ((mm hash, offset in block), vLLM's event
    format), and a different item at the same place matches only the blocks before it."""
    from epp.framework.types import MultiModalFeature

    plugin, rig = make()
    toks = [100 + i for i in range(6 * BS)]
    offset, length = 2 * BS + 5, 40  # blocks 2, 3 and 4 hold the item's placeholders
    extra: list[Any] = [None, None, [("img-a", 5)], [("img-a", -11)], [("img-a", -27)], None]
    ev = vllm_kv.BlockStored(
        block_hashes=[7000 + i for i in range(6)],
        parent_block_hash=None,
        token_ids=toks,
        block_size=BS,
        lora_id=None,
        medium="GPU",
        lora_name=None,
        extra_keys=extra,
    )
    payload = msgspec.msgpack.encode(vllm_kv.KVEventBatch(ts=time.time(), events=[ev]))
    rig.svc.applier.apply(EPS[1].hostport, QWEN25_MODEL, decode_batch(payload))

    def generate(rid: str, item: str | None) -> InferenceRequest:
        feats = [MultiModalFeature("image", item, offset, length)] if item else None
        body = {"token_ids": toks}
        return InferenceRequest(
            rid, "/inference/v1/generate", ApiKind.COMPLETIONS, QWEN25_MODEL, QWEN25_MODEL, body, token_ids=toks,
            mm_features=feats,
        )  # fmt: skip

    same, other, none = generate("a", "img-a"), generate("b", "img-b"), generate("c", None)
    for r in (same, other, none):
        await rig.prepare(r, EPS)
    assert plugin.score(CycleState(), same, EPS) == [0.0, pytest.approx(1.0), 0.0]
    assert plugin.score(CycleState(), other, EPS) == [0.0, pytest.approx(2 / 6), 0.0]
    assert plugin.score(CycleState(), none, EPS) == [0.0, pytest.approx(2 / 6), 0.0]


def test_block_sizes_learned_for_client_model_names_are_bounded() -> None:
    """The model a request names is the client's: a block size learned from the scraped pages for each new name
    must not grow the map without bound (the size is still answered past the bound, and stays fixed for the names
    learned first)."""
    from epp.kvcache.tokens import MAX_LEARNED_MODELS, BlockSizes

    sizes = BlockSizes({"configured": 64})
    assert sizes.learn("first", 32) == 32
    for i in range(3 * MAX_LEARNED_MODELS):
        assert sizes.learn(f"client-{i}", 16) == 16
    assert len(sizes._sizes) <= MAX_LEARNED_MODELS + 1
    assert sizes.learn("first", 16) == 32 and sizes.get("configured") == 64


async def test_error_responses_do_not_count_against_the_engine_counters(vllm_kv: Any) -> None:
    """A response without usage that is an error (a 400 for a too-long prompt, a 429 or 503 from an overloaded engine,
    Envoy's 503 for a pod it cannot reach) had no prefill there: counting its prompt and predicted hit against the
    engine's counters made a good index look short and resynced it. With the same responses answered 200 the pod is
    resynced (test above)."""
    from epp.framework import RESPONSE_STATUS

    plugin, rig = make({**PARAMS, "speculativeIndexing": False, "deliveredHitsConfig": {"window": 4}})
    eps = [Endpoint(f"pod{i}", f"10.0.1.{i}", 8000) for i in range(3)]
    req = chat_request(LONG)
    await rig.prepare(req, eps)
    toks = tokens(req)
    store_tokens(vllm_kv, rig.svc, eps[1].hostport, toks, len(toks) // BS, 7100)
    hits, queries = 0.0, 0.0
    for i in range(8):
        eps[1].metrics = Metrics(prefix_cache_hits=hits, prefix_cache_queries=queries, update_time=time.monotonic())
        r = chat_request(LONG, f"e{i}")
        await rig.prepare(r, eps)
        r.data.put(RESPONSE_STATUS, (400, 429, 503, 500)[i % 4])
        plugin.response_complete(r, eps[1], None)
        queries += 100  # other traffic the engine served uncached meanwhile
    again = chat_request(LONG, "after")
    await rig.prepare(again, eps)
    assert plugin.score(CycleState(), again, eps) == [0.0, 1.0, 0.0]


@pytest.mark.parametrize("events", [False, True])
async def test_delivered_hits_windows_go_when_the_endpoint_leaves(events: bool) -> None:
    """The delivered-hits windows of a pod that leaves the pool go with it, KV events on or off: one back at the
    same address is a new engine, and the windows of pods gone must not pile up. They went only through the event
    pool's subscriptions, which exist only with events on."""
    _, rig = make({**PARAMS, "kvEventsConfig": {**PARAMS["kvEventsConfig"], "enabled": events}})
    svc = rig.svc
    ep = Endpoint("m0", "10.0.0.9", 8000)
    rig.ds.upsert(ep)
    svc.report_delivered(ep.hostport, list(range(10)), 10, 32, 16, 160)
    svc.report_counted(CountedReport(ep.hostport, 10, 10, 16, 160, 100.0, 1000.0))
    assert ep.hostport in svc.feedback.pods and ep.hostport in svc.feedback.counter_pods
    rig.ds.upsert(Endpoint("m0", "10.0.0.9", 8000, labels={"x": "y"}))  # relabelled in place: the same engine
    assert ep.hostport in svc.feedback.pods and ep.hostport in svc.feedback.counter_pods
    rig.ds.remove("m0")
    assert ep.hostport not in svc.feedback.pods and ep.hostport not in svc.feedback.counter_pods


async def test_lone_surrogates_are_no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    """A `\\ud800` escape in a prompt, in chat messages or in the model name: not tokenized (no prefix score), one
    line without a stack dump; was `TypeError: TextInputSequence must be str` / `UnicodeEncodeError` tracebacks."""
    plugin, rig = make()
    reqs = [
        InferenceRequest(
            "c", "/v1/completions", ApiKind.COMPLETIONS, QWEN25_MODEL, QWEN25_MODEL, body={}, prompt="x\ud800y"
        ),
        chat_request("hello \udc00 there", rid="chat"),
        InferenceRequest("m", "/v1/completions", ApiKind.COMPLETIONS, "a\ud800", "a\ud800", body={}, prompt="x"),
    ]
    for req in reqs:
        await rig.prepare(req, EPS)  # raises nothing
    assert TOKENIZED_PROMPT not in reqs[0].data and TOKENIZED_PROMPT not in reqs[1].data
    assert plugin.score(CycleState(), reqs[2], EPS) == [0.0, 0.0, 0.0]
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records]
    ok = chat_request(LONG, rid="ok")
    await rig.prepare(ok, EPS)
    assert tokens(ok)
    assert PromptTokenizer._key("a\ud800", "completion", "x")
