"""Engine metrics extraction: vLLM (new and old names, LoRA, cache info), SGLang and custom engines, prefix-cache
counters."""

from __future__ import annotations

from epp.datalayer.extractor import ENGINE_LABEL, CoreMetricsExtractor, EngineConfig
from epp.framework import Endpoint


def vllm_page(waiting: int, running: int, kv: float, *, old_kv_name: bool = False, lora: bool = True) -> str:
    """A vLLM-shaped /metrics page, with histogram noise around the families we read."""
    kv_name = "vllm:gpu_cache_usage_perc" if old_kv_name else "vllm:kv_cache_usage_perc"
    lines = [
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge",
        f'vllm:num_requests_running{{engine="0",model_name="Qwen/Qwen2.5-0.5B-Instruct"}} {running}.0',
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
        "# TYPE vllm:num_requests_waiting gauge",
        f'vllm:num_requests_waiting{{engine="0",model_name="Qwen/Qwen2.5-0.5B-Instruct"}} {waiting}.0',
        'vllm:num_requests_waiting_by_reason{engine="0",reason="capacity"} 99.0',
        f"# TYPE {kv_name} gauge",
        f'{kv_name}{{engine="0",model_name="Qwen/Qwen2.5-0.5B-Instruct"}} {kv}',
        "# TYPE vllm:cache_config_info gauge",
        'vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",num_gpu_blocks="2048"} 1.0',
    ]
    if lora:
        lines += [
            "# TYPE vllm:lora_requests_info gauge",
            'vllm:lora_requests_info{max_lora="2",running_lora_adapters="",waiting_lora_adapters=""} 1.7e9',
            'vllm:lora_requests_info{max_lora="2",running_lora_adapters="sql-lora,tweet",'
            'waiting_lora_adapters="chat"} 1.8e9',
        ]
    for h in ("vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds"):
        lines.append(f"# TYPE {h} histogram")
        for le in ("0.001", "0.01", "0.1", "1.0", "10.0", "+Inf"):
            lines.append(f'{h}_bucket{{engine="0",le="{le}",model_name="m"}} 5.0')
        lines += [f'{h}_sum{{engine="0",model_name="m"}} 1.5', f'{h}_count{{engine="0",model_name="m"}} 5.0']
    return "\n".join(lines) + "\n"


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
