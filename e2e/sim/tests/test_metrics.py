"""/metrics: vLLM's names, labels and values, parsed with prometheus_client's parser."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from e2e.sim.launch import Sim

from .helpers import get, post

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"


def scrape(sim: Sim) -> dict[str, list[Any]]:
    status, text = get(sim.url + "/metrics")
    assert status == 200
    out: dict[str, list[Any]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append(s)
    return out


def value(m: dict[str, list[Any]], name: str, **labels: str) -> float:
    got = [s.value for s in m[name] if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(got) == 1, (name, labels, m.get(name))
    return float(got[0])


def wait_for(pred: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def test_metrics_names_labels_and_values(thread_sim_factory: Any) -> None:
    sim: Sim = thread_sim_factory(
        "--max-num-seqs", "2", "--inter-token-latency", "0.05", "--lora-modules", "a", "b", "--max-loras", "1",
        "--num-gpu-blocks", "100", "--legacy-gpu-cache-metric", events=False,
    )  # fmt: skip
    m = scrape(sim)
    assert not [n for n in m if n.endswith("_created")]
    assert value(m, "vllm:num_requests_running", model_name=MODEL) == 0
    assert value(m, "vllm:kv_cache_usage_perc", model_name=MODEL) == 0
    info = m["vllm:cache_config_info"]
    assert len(info) == 1 and info[0].labels["block_size"] == "16" and info[0].labels["num_gpu_blocks"] == "100"

    prompt = "Tell me about the sea. " * 20
    with ThreadPoolExecutor(2) as pool:
        fa = pool.submit(post, sim.url + "/v1/completions", {"model": "a", "prompt": prompt, "max_tokens": 20})
        wait_for(lambda: value(scrape(sim), "vllm:num_requests_running", model_name=MODEL) == 1)
        fb = pool.submit(post, sim.url + "/v1/completions", {"model": "b", "prompt": prompt, "max_tokens": 2})
        # b waits: a free seat, but max-loras=1 and adapter a holds it
        wait_for(lambda: value(scrape(sim), "vllm:num_requests_waiting", model_name=MODEL) == 1)
        m = scrape(sim)
        assert value(m, "vllm:num_requests_running", model_name=MODEL) == 1
        usage = value(m, "vllm:kv_cache_usage_perc", model_name=MODEL)
        assert 0 < usage < 1 and value(m, "vllm:gpu_cache_usage_perc", model_name=MODEL) == usage
        latest = max(m["vllm:lora_requests_info"], key=lambda s: s.value)
        assert latest.labels == {"max_lora": "1", "running_lora_adapters": "a", "waiting_lora_adapters": "b"}
        assert abs(latest.value - time.time()) < 60
        assert fa.result()[0] == 200 and fb.result()[0] == 200

    m = scrape(sim)
    assert value(m, "vllm:num_requests_running", model_name=MODEL) == 0
    assert value(m, "vllm:num_requests_waiting", model_name=MODEL) == 0
    assert value(m, "vllm:kv_cache_usage_perc", model_name=MODEL) == 0
    assert value(m, "vllm:time_to_first_token_seconds_count", model_name=MODEL) == 2
    assert value(m, "vllm:inter_token_latency_seconds_count", model_name=MODEL) == 19 + 1
    assert value(m, "vllm:e2e_request_latency_seconds_count", model_name=MODEL) == 2
    assert value(m, "vllm:request_success_total", model_name=MODEL, finished_reason="length") == 2
    assert value(m, "vllm:generation_tokens_total", model_name=MODEL) == 22
    # b queued behind a for about a's whole run (20 tokens x 50 ms)
    assert value(m, "vllm:request_queue_time_seconds_sum", model_name=MODEL) > 0.5

    # prefix-cache counters count tokens: a second identical base-model request hits every full block but the last
    _, r1 = post(sim.url + "/v1/completions", {"prompt": prompt, "max_tokens": 1})
    _, r2 = post(sim.url + "/v1/completions", {"prompt": prompt, "max_tokens": 1})
    n = r1["usage"]["prompt_tokens"]
    m = scrape(sim)
    assert value(m, "vllm:prefix_cache_queries_total", model_name=MODEL) == 4 * n
    assert (
        value(m, "vllm:prefix_cache_hits_total", model_name=MODEL)
        == r2["usage"]["prompt_tokens_details"]["cached_tokens"]
    )
    assert value(m, "vllm:prompt_tokens_total", model_name=MODEL) == 4 * n


def test_prefix_cache_counters_are_vllms_and_count_without_prompt_tokens_details(thread_sim_factory: Any) -> None:
    """The counter names are the ones vLLM's own Prometheus logger registers (read from the installed package's
    source: importing it needs torch); `--no-prompt-tokens-details` drops cached_tokens from usage, not the counts."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.submodule_search_locations
    loggers = (Path(next(iter(spec.submodule_search_locations))) / "v1" / "metrics" / "loggers.py").read_text()
    for name in ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits"):
        assert f'name="{name}"' in loggers, name
    sim: Sim = thread_sim_factory("--no-prompt-tokens-details", events=False)
    prompt = "Tell me about the sea. " * 20
    _, r1 = post(sim.url + "/v1/completions", {"prompt": prompt, "max_tokens": 1})
    _, r2 = post(sim.url + "/v1/completions", {"prompt": prompt, "max_tokens": 1})
    assert "prompt_tokens_details" not in r1["usage"] and "prompt_tokens_details" not in r2["usage"]
    n = r1["usage"]["prompt_tokens"]
    m = scrape(sim)
    assert value(m, "vllm:prefix_cache_queries_total", model_name=MODEL) == 2 * n
    assert value(m, "vllm:prefix_cache_hits_total", model_name=MODEL) == (n - 1) // 16 * 16
    # switched back at run time: reported again
    assert post(sim.url + "/admin/config", {"prompt_tokens_details": True})[0] == 200
    assert post(sim.url + "/admin/config", {"prompt_tokens_details": 1})[0] == 400
    _, r3 = post(sim.url + "/v1/completions", {"prompt": prompt, "max_tokens": 1})
    assert r3["usage"]["prompt_tokens_details"]["cached_tokens"] == (n - 1) // 16 * 16
