"""Engine metrics extraction: vLLM (new and old names, LoRA, cache info), SGLang and custom engines, prefix-cache
counters."""

from __future__ import annotations

from epp.datalayer.extractor import ENGINE_LABEL, CoreMetricsExtractor, EngineConfig
from epp.framework import Endpoint
from tests.datalayer.support_metrics import vllm_page


def test_extractor_vllm_new_and_old_names_lora_and_cache_info() -> None:
    ep = Endpoint("p", "10.0.0.1", 8000)
    ex = CoreMetricsExtractor()
    m = ex.extract(vllm_page(3, 2, 0.25), ep, now=123.0)
    assert (m.waiting_queue_size, m.running_requests_size, m.kv_cache_usage_percent) == (3, 2, 0.25)
    assert m.active_models == {"sql-lora", "tweet"} and m.waiting_models == {"chat"}  # the newest series
    assert m.max_active_models == 2 and (m.cache_block_size, m.cache_num_blocks) == (16, 2048)
    assert m.update_time == 123.0
    old = ex.extract(vllm_page(1, 1, 0.5, old_kv_name=True, lora=False), ep)
    assert old.kv_cache_usage_percent == 0.5 and old.active_models == frozenset()


def test_extractor_sglang_by_engine_label_and_custom_engine() -> None:
    page = "sglang:num_queue_reqs 4\nsglang:num_running_reqs 7\nsglang:token_usage 0.6\n"
    page += 'sglang:cache_config_info{page_size="32",num_pages="100"} 1\n'
    ep = Endpoint("s", "10.0.0.2", 30000, labels={"inference.networking.k8s.io/engine-type": "sglang"})
    m = CoreMetricsExtractor().extract(page, ep)
    assert (m.waiting_queue_size, m.running_requests_size, m.kv_cache_usage_percent) == (4, 7, 0.6)
    assert (m.cache_block_size, m.cache_num_blocks) == (32, 100)
    custom = EngineConfig.from_specs("mine", 'q{kind="wait"}', "r", "")
    ex = CoreMetricsExtractor({"mine": custom}, default_engine="mine")
    m2 = ex.extract('q{kind="wait"} 5\nq{kind="other"} 100\nr 1\n', Endpoint("x", "10.0.0.3", 1))
    assert (m2.waiting_queue_size, m2.running_requests_size) == (5, 1)


def test_extractor_prefix_cache_counters() -> None:
    """vLLM's counters (prometheus_client renders them with _total and _created), summed over engines (DP ranks);
    SGLang's prompt / cached tokens; absent on the page or configured off: None."""
    page = vllm_page(0, 0, 0.1) + "\n".join(
        [
            "# TYPE vllm:prefix_cache_queries counter",
            'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1600.0',
            'vllm:prefix_cache_queries_total{engine="1",model_name="m"} 400.0',
            'vllm:prefix_cache_queries_created{engine="0",model_name="m"} 1.7e9',
            "# TYPE vllm:prefix_cache_hits counter",
            'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 320.0',
            'vllm:prefix_cache_hits_total{engine="1",model_name="m"} 0.0',
            'vllm:external_prefix_cache_hits_total{engine="0",model_name="m"} 99.0',
        ]
    )
    ep = Endpoint("p", "10.0.0.1", 8000)
    m = CoreMetricsExtractor().extract(page, ep)
    assert (m.prefix_cache_queries, m.prefix_cache_hits) == (2000.0, 320.0)
    bare = CoreMetricsExtractor().extract(vllm_page(0, 0, 0.1), ep)
    assert (bare.prefix_cache_queries, bare.prefix_cache_hits) == (None, None)
    sgl = 'sglang:num_queue_reqs 0\nsglang:prompt_tokens_total{model_name="m"} 500\n'
    sgl += 'sglang:cached_tokens_total{cache_source="device"} 100\nsglang:cached_tokens_total{cache_source="host"} 20\n'
    s = CoreMetricsExtractor().extract(sgl, Endpoint("s", "10.0.0.2", 1, labels={ENGINE_LABEL: "sglang"}))
    assert (s.prefix_cache_queries, s.prefix_cache_hits) == (500.0, 120.0)
    off = CoreMetricsExtractor({"vllm": EngineConfig.from_specs("vllm", "a", "b", "c")})
    assert off.extract(page, ep).prefix_cache_queries is None
