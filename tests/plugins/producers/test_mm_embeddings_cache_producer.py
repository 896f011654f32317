"""mm-embeddings-cache-producer / -scorer: per-endpoint LRU of the multimodal items routed there (the router's
encoder-cache affinity), matched / total as the score."""

from __future__ import annotations

import pytest

from epp.config import ConfigError, parse_config
from epp.datalayer.datastore import Datastore
from epp.framework import (
    TOKENIZED_PROMPT,
    ApiKind,
    CycleState,
    Endpoint,
    InferenceRequest,
    PluginConfigError,
    ProfileResult,
    SchedulingResult,
    TokenizedPrompt,
)
from epp.framework.types import MultiModalFeature
from epp.plugins.producers.mm_embeddings_cache_producer import (
    HITS,
    MM_CACHE_MATCH,
    MMEmbeddingsCacheProducer,
    lru_capacity,
)
from epp.plugins.scorers.mm_embeddings_cache_scorer import MMEmbeddingsCacheScorer
from epp.wiring import build_pipeline, plugin_context
from tests.helpers import build


def ep(i: int) -> Endpoint:
    return Endpoint(f"e{i}", f"10.0.0.{i}", 8000)


def req(rid: str, *hashes: str, modality: str = "image") -> InferenceRequest:
    r = InferenceRequest(rid, "/v1/chat/completions", ApiKind.CHAT, "m", "m", {})
    feats = [MultiModalFeature(modality, h, 10 * i, 4) for i, h in enumerate(hashes)]
    r.data.put(TOKENIZED_PROMPT, TokenizedPrompt([1] * 64, feats or None))
    return r


def routed(p: MMEmbeddingsCacheProducer, r: InferenceRequest, target: Endpoint) -> None:
    p.pre_request(r, SchedulingResult({"default": ProfileResult([target])}, "default"))


async def test_repeated_image_scores_the_endpoint_that_encoded_it() -> None:
    p = build(MMEmbeddingsCacheProducer)
    s = build(MMEmbeddingsCacheScorer)
    e1, e2, e3 = ep(1), ep(2), ep(3)
    r1 = req("r1", "imgA", "imgB")
    await p.prepare(r1, [e1, e2, e3])
    assert s.score(CycleState(), r1, [e1, e2, e3]) == [0.0, 0.0, 0.0]
    routed(p, r1, e2)
    r2 = req("r2", "imgA", "imgC", "imgA")  # a repeated reference counts once: 1 of 2 distinct items on e2
    await p.prepare(r2, [e1, e2, e3])
    assert s.score(CycleState(), r2, [e1, e2, e3]) == [0.0, 0.5, 0.0]
    r3 = req("r3", "imgB", "imgA")
    await p.prepare(r3, [e1, e2, e3])
    assert s.score(CycleState(), r3, [e1, e2, e3]) == [0.0, 1.0, 0.0]
    assert HITS.labels("mm-embeddings-cache-producer", p.name, "e2", "image")._value.get() >= 3


async def test_text_only_request_scores_zero_and_writes_nothing() -> None:
    p = build(MMEmbeddingsCacheProducer)
    s = build(MMEmbeddingsCacheScorer)
    r = req("r")
    await p.prepare(r, [ep(1)])
    assert r.data.get(MM_CACHE_MATCH.of(p.name)) is None
    assert s.score(CycleState(), r, [ep(1)]) == [0.0]
    routed(p, r, ep(1))
    assert p.caches == {}


async def test_lru_capacity_per_endpoint_from_the_mib_budget() -> None:
    assert lru_capacity(4096) == 2048 and lru_capacity(0) == 2048 and lru_capacity(-5) == 2048
    assert lru_capacity(1) == 1 and lru_capacity(6) == 3
    p = build(MMEmbeddingsCacheProducer, {"cacheSizeInMBPerServer": 4})  # 2 items per endpoint
    s = build(MMEmbeddingsCacheScorer)
    e1 = ep(1)
    for h in ("a", "b", "c"):
        r = req(h, h)
        await p.prepare(r, [e1])
        routed(p, r, e1)
    assert list(p.caches["e1"]) == ["b", "c"]  # "a", the least recently routed, was evicted
    r = req("x", "a", "b", "c")
    await p.prepare(r, [e1])
    assert s.score(CycleState(), r, [e1]) == [pytest.approx(2 / 3)]


async def test_cache_size_name_and_unknown_parameters() -> None:
    assert build(MMEmbeddingsCacheProducer, {"cacheSizeInMBPerServer": 6}).capacity == 3
    with pytest.raises(PluginConfigError, match="cacheSizeInMBPerServer"):
        build(MMEmbeddingsCacheProducer, {"cacheSizeInMBPerServer": "big"})
    # llm-d-router v0.10 has no `cacheSizeInMB` (its strict decoder rejects it): an unknown parameter, with its line
    text = "plugins:\n- type: mm-embeddings-cache-producer\n  parameters:\n    cacheSizeInMB: 2048\n"
    with pytest.raises(ConfigError, match=r"^mm\.yaml:4: plugins\[0\]\.parameters\.cacheSizeInMB: .*unknown parameter"):
        build_pipeline(parse_config(text, source="mm.yaml"), plugin_context(Datastore()))


async def test_removed_endpoint_drops_its_lru_and_named_producers_are_separate() -> None:
    store = Datastore()
    ctx = plugin_context(store)
    p = build(MMEmbeddingsCacheProducer, name="mm-a", ctx=ctx)
    s_default = build(MMEmbeddingsCacheScorer)
    s_named = build(MMEmbeddingsCacheScorer, {"producerName": "mm-a"})
    e1 = ep(1)
    store.upsert(e1)
    r = req("r1", "img")
    await p.prepare(r, [e1])
    routed(p, r, e1)
    r2 = req("r2", "img")
    await p.prepare(r2, [e1])
    assert s_named.score(CycleState(), r2, [e1]) == [1.0]
    assert s_default.score(CycleState(), r2, [e1]) == [0.0]  # reads mm-embeddings-cache-producer's key
    store.remove(e1.name)
    assert "e1" not in p.caches
