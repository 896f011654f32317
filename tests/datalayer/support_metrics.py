"""Helpers shared by the metrics reading, extraction and scraper tests."""

from __future__ import annotations


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
