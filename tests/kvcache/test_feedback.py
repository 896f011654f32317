"""The closed loop on delivered hits (epp/kvcache/feedback.py) through the KV service the plugins see."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from epp.framework import CountedReport, Params, PluginConfigError
from epp.kvcache.feedback import DeliveredHits, FeedbackConfig, FeedbackMetrics
from epp.kvcache.service import KVCacheService, KVCacheSettings

KEYS = list(range(1000, 1010))  # a 10-block prompt (160 tokens at block size 16)


def service(**cfg: float) -> tuple[KVCacheService, FeedbackMetrics, CollectorRegistry]:
    reg = CollectorRegistry()
    svc = KVCacheService(KVCacheSettings(block_size=16))
    m = FeedbackMetrics(reg)
    svc.feedback = DeliveredHits(FeedbackConfig(**cfg), svc.resync_pod, svc.speculate, m)  # type: ignore[arg-type]
    return svc, m, reg


def value(reg: CollectorRegistry, name: str, pod: str) -> float:
    return reg.get_sample_value(name, {"pod": pod}) or 0.0


async def blocks(svc: KVCacheService, pod: str) -> int:
    m = (await svc.match(KEYS, [pod])).get(pod)
    return m.blocks if m else 0


async def test_stale_entries_are_detected_and_cleared_within_the_window() -> None:
    svc, _, reg = service(window=8, max_shortfall=0.5)
    svc.index.add(None, KEYS, "a:80", 0)  # the index believes pod a holds all 10 blocks
    svc.index.add(None, KEYS[:4], "b:80", 0)
    assert await blocks(svc, "a:80") == 10
    for i in range(7):  # the engine delivers 2 of the predicted blocks: not yet a full window
        svc.report_delivered("a:80", KEYS, 10, 32, 16, 160)
        assert await blocks(svc, "a:80") == 10, i
    svc.report_delivered("a:80", KEYS, 10, 32, 16, 160)  # the 8th: shortfall 80% > 50% → cleared
    assert await blocks(svc, "a:80") == 0
    assert await blocks(svc, "b:80") == 4  # the other pod is untouched
    assert value(reg, "kv_cache_delivered_hits_resyncs_total", "a:80") == 1
    # at most (160 - 1) // 16 = 9 blocks can hit (the engine computes the last token): 8 x 9 x 16 predicted
    assert value(reg, "kv_cache_delivered_hits_predicted_tokens_total", "a:80") == 8 * 9 * 16
    assert value(reg, "kv_cache_delivered_hits_delivered_tokens_total", "a:80") == 8 * 32
    assert value(reg, "kv_cache_delivered_hits_regret_tokens_total", "a:80") == 8 * (9 * 16 - 32)


async def test_a_small_or_short_lived_shortfall_does_not_resync() -> None:
    svc, _, reg = service(window=8, max_shortfall=0.5)
    svc.index.add(None, KEYS, "a:80", 0)
    for i in range(40):  # mostly delivered, one miss in four (a burst's speculative entries, a racing eviction)
        svc.report_delivered("a:80", KEYS, 9, 0 if i % 4 == 0 else 144, 16, 160)
    assert await blocks(svc, "a:80") == 10
    assert value(reg, "kv_cache_delivered_hits_resyncs_total", "a:80") == 0
    # requests the index predicted nothing for do not count against the pod
    for _ in range(20):
        svc.report_delivered("c:80", KEYS, 0, 0, 16, 160)
    assert value(reg, "kv_cache_delivered_hits_resyncs_total", "c:80") == 0


async def test_delivered_blocks_the_index_missed_are_confirmed() -> None:
    svc, _, reg = service(confirm_ttl=30.0)
    svc.index.add(None, KEYS[:2], "a:80", 0)
    svc.report_delivered("a:80", KEYS, 2, 96, 16, 160)  # the engine had 6 blocks: 4 BlockStored events were lost
    assert await blocks(svc, "a:80") == 6
    assert value(reg, "kv_cache_delivered_hits_confirmed_blocks_total", "a:80") == 4
    off, _, _ = service(enabled=False)
    off.report_delivered("a:80", KEYS, 0, 96, 16, 160)
    assert await blocks(off, "a:80") == 0


def test_delivered_hits_config_from_the_producer_parameters() -> None:
    s = KVCacheSettings.from_params(
        Params("p", {"deliveredHitsConfig": {"window": 32, "maxShortfall": 0.8, "confirmTTL": "2m"}})
    )
    assert s.feedback == FeedbackConfig(enabled=True, window=32, max_shortfall=0.8, confirm_ttl=120.0)
    with pytest.raises(PluginConfigError, match="maxShortfall"):
        KVCacheSettings.from_params(Params("p", {"deliveredHitsConfig": {"maxShortfall": 0}}))


class Engine:
    """An engine's prefix-cache counters, as the scraper would last have read them."""

    def __init__(self) -> None:
        self.hits = 1000.0
        self.queries = 5000.0

    def serve(self, prompt: int, cached: int) -> None:
        self.queries += prompt
        self.hits += cached


async def test_engine_counters_detect_a_shortfall_without_cached_tokens() -> None:
    svc, _, reg = service(window=8, max_shortfall=0.5)
    svc.index.add(None, KEYS, "a:80", 0)  # the index believes pod a holds all 10 blocks; it holds 2
    eng = Engine()
    for i in range(8):  # one request per scrape interval: 8 requests with a predicted hit close 7 intervals
        svc.report_counted(CountedReport("a:80", 10, 10, 16, 160, eng.hits, eng.queries))
        eng.serve(160, 32)
        if i < 7:
            assert await blocks(svc, "a:80") == 10, i
    assert value(reg, "kv_cache_delivered_hits_counter_intervals_total", "a:80") == 7
    svc.report_counted(
        CountedReport("a:80", 10, 10, 16, 160, eng.hits, eng.queries)
    )  # the 8th interval closes: 80% short
    assert await blocks(svc, "a:80") == 0
    assert value(reg, "kv_cache_delivered_hits_resyncs_total", "a:80") == 1
    # per interval: 9 blocks predicted (the engine computes the last token), the engine's 32/160 share delivered
    assert value(reg, "kv_cache_delivered_hits_predicted_tokens_total", "a:80") == 8 * 9 * 16
    assert value(reg, "kv_cache_delivered_hits_delivered_tokens_total", "a:80") == 8 * 32
    assert value(reg, "kv_cache_delivered_hits_requests_total", "a:80") == 8


async def test_engine_counters_compare_shares_not_tokens() -> None:
    svc, _, reg = service(window=8, max_shortfall=0.5)
    svc.index.add(None, KEYS, "a:80", 0)
    eng = Engine()
    for _ in range(40):
        # other replicas' traffic in the same interval: 3 more prompts, delivered as predicted
        svc.report_counted(CountedReport("a:80", 10, 9, 16, 160, eng.hits, eng.queries))
        for _ in range(4):
            eng.serve(160, 144)
    assert value(reg, "kv_cache_delivered_hits_resyncs_total", "a:80") == 0
    assert await blocks(svc, "a:80") == 10
    # several requests between two scrapes make one interval; no scrape (unchanged counters) closes nothing
    before = value(reg, "kv_cache_delivered_hits_counter_intervals_total", "a:80")
    for _ in range(5):
        svc.report_counted(CountedReport("a:80", 10, 9, 16, 160, eng.hits, eng.queries))
    assert value(reg, "kv_cache_delivered_hits_counter_intervals_total", "a:80") == before + 1
    # without counters on the pod's page there is nothing to compare
    for _ in range(20):
        svc.report_counted(CountedReport("b:80", 10, 9, 16, 160, None, None))
    assert value(reg, "kv_cache_delivered_hits_counter_intervals_total", "b:80") == 0


async def test_engine_counters_that_go_back_restart_the_comparison() -> None:
    svc, _, reg = service(window=4, max_shortfall=0.5)
    svc.index.add(None, KEYS, "a:80", 0)
    eng = Engine()
    for _ in range(3):  # 2 short intervals closed (the first report only sets the base)
        svc.report_counted(CountedReport("a:80", 10, 10, 16, 160, eng.hits, eng.queries))
        eng.serve(160, 0)
    eng.hits, eng.queries = 0.0, 0.0  # the engine restarted: the counters start again
    for _ in range(3):  # a new base, then 2 intervals: the 2 before the restart no longer count, no window yet
        svc.report_counted(CountedReport("a:80", 10, 10, 16, 160, eng.hits, eng.queries))
        eng.serve(160, 0)
    assert value(reg, "kv_cache_delivered_hits_resyncs_total", "a:80") == 0
    assert await blocks(svc, "a:80") == 10
    for _ in range(2):
        svc.report_counted(CountedReport("a:80", 10, 10, 16, 160, eng.hits, eng.queries))
        eng.serve(160, 0)
    assert value(reg, "kv_cache_delivered_hits_resyncs_total", "a:80") == 1


async def test_engine_counts_scraped_before_the_response_ends_do_not_fake_a_shortfall() -> None:
    """Each request is scraped between its admission and its completion, so its engine counts close the interval
    before the one its prediction lands in; hits and misses alternate. Healthy: no resync."""
    svc, _, reg = service(window=8, max_shortfall=0.5)
    svc.index.add(None, KEYS, "a:80", 0)
    eng = Engine()
    for i in range(60):
        hit = i % 2 == 0
        eng.serve(160, 144 if hit else 0)  # admitted and scraped before the response completes
        svc.report_counted(CountedReport("a:80", 10, 9 if hit else 0, 16, 160, eng.hits, eng.queries))
    assert value(reg, "kv_cache_delivered_hits_counter_intervals_total", "a:80") == 59
    assert value(reg, "kv_cache_delivered_hits_resyncs_total", "a:80") == 0
    assert await blocks(svc, "a:80") == 10


async def test_a_pod_that_leaves_the_pool_takes_its_windows_with_it() -> None:
    """A pod back at the same address (a restart) is a new engine: the samples and counter base of the old one must
    not count in its first window, and the windows of pods gone must not pile up."""
    svc, _, _ = service(window=8, max_shortfall=0.5)
    svc.index.add(None, KEYS, "a:80", 0)
    for _ in range(7):  # 7 short requests: one more would resync the pod
        svc.report_delivered("a:80", KEYS, 10, 32, 16, 160)
    svc.report_counted(CountedReport("a:80", 10, 10, 16, 160, 100.0, 1000.0))
    svc.pool.workers.forget("a:80")  # the pod left (its subscription stopped)
    assert "a:80" not in svc.feedback.pods and "a:80" not in svc.feedback.counter_pods
    svc.index.add(None, KEYS, "a:80", 0)  # back, and its events say it holds the prompt
    svc.report_delivered("a:80", KEYS, 10, 32, 16, 160)  # its first short request is no window's 8th
    assert await blocks(svc, "a:80") == 10
