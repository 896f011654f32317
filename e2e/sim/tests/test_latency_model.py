"""The latency model in real time: cache hits cut TTFT, max-num-seqs queues, load slows decoding."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from e2e.sim.launch import Sim

from .helpers import post, stream_ttft

PROMPT = "An unusually long system prompt describing a support agent's duties in detail. " * 40


def test_warm_prefix_has_lower_ttft(thread_sim_factory: Any) -> None:
    sim: Sim = thread_sim_factory("--prefill-overhead", "0.005", "--prefill-time-per-token", "0.001", events=False)
    body = {"prompt": PROMPT, "max_tokens": 2}
    cold, _ = stream_ttft(sim.url + "/v1/completions", body)
    _, r = post(sim.url + "/v1/completions", {"prompt": PROMPT, "max_tokens": 1})
    n = r["usage"]["prompt_tokens"]
    assert n > 500
    assert cold >= 0.005 + n * 0.001 * 0.95
    warm, _ = stream_ttft(sim.url + "/v1/completions", body)
    assert warm < cold / 3
    # a different prompt is cold again
    other, _ = stream_ttft(sim.url + "/v1/completions", {"prompt": "Different: " + PROMPT, "max_tokens": 2})
    assert other > 3 * warm


def test_requests_beyond_max_num_seqs_queue(thread_sim_factory: Any) -> None:
    sim: Sim = thread_sim_factory(
        "--max-num-seqs", "1", "--inter-token-latency", "0.02", "--prefill-overhead", "0.001", events=False
    )
    body = {"prompt": "hello there", "max_tokens": 25}
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(stream_ttft, sim.url + "/v1/completions", body)
        time.sleep(0.1)
        second = pool.submit(stream_ttft, sim.url + "/v1/completions", body)
        t1, t2 = first.result()[0], second.result()[0]
    assert t1 < 0.1
    assert t2 > 0.3  # waited for the first request's ~0.5 s decode


def test_decode_slows_under_load(thread_sim_factory: Any) -> None:
    sim: Sim = thread_sim_factory(
        "--max-num-seqs", "2", "--inter-token-latency", "0.02", "--time-factor-under-load", "3", events=False
    )
    body = {"prompt": "hello", "max_tokens": 20}

    def e2e() -> float:
        t0 = time.perf_counter()
        assert post(sim.url + "/v1/completions", body)[0] == 200
        return time.perf_counter() - t0

    alone = e2e()
    with ThreadPoolExecutor(2) as pool:
        both = [f.result() for f in [pool.submit(e2e), pool.submit(e2e)]]
    assert alone >= 19 * 0.02
    assert min(both) > 2 * alone


def test_shared_prefill_throughput_queues_prefills(thread_sim_factory: Any) -> None:
    """--prefill-tokens-per-second: two cold prompts sent together prefill one after the other."""
    sim: Sim = thread_sim_factory(
        "--prefill-tokens-per-second", "2000", "--prefill-overhead", "0.001", "--max-num-seqs", "4", events=False
    )
    _, r = post(sim.url + "/v1/completions", {"prompt": "Zeta: " + PROMPT, "max_tokens": 1})
    n = r["usage"]["prompt_tokens"]  # ~650 tokens: ~0.33 s of prefill each
    with ThreadPoolExecutor(2) as pool:
        futs = [pool.submit(stream_ttft, sim.url + "/v1/completions", {"prompt": f"{k}: " + PROMPT, "max_tokens": 2})
                for k in ("Alpha", "Beta")]  # fmt: skip
        ttfts = sorted(f.result()[0] for f in futs)
    one = n / 2000
    assert ttfts[0] >= one * 0.9
    assert ttfts[1] >= 1.8 * one  # waited for the other prefill
    # the cached part is not prefilled again: only the uncached tokens cost time
    warm, _ = stream_ttft(sim.url + "/v1/completions", {"prompt": "Alpha: " + PROMPT, "max_tokens": 2})
    assert warm < one / 3


def test_a_queued_prefill_reuses_what_the_prefill_ahead_computed(thread_sim_factory: Any) -> None:
    """--prefill-tokens-per-second: the cache hit is looked up when the prefill starts (as vLLM schedules it), so
    a request queued behind another with the same prompt computes only what that one did not."""
    sim: Sim = thread_sim_factory(
        "--prefill-tokens-per-second", "2000", "--prefill-overhead", "0.001", "--max-num-seqs", "4", events=False
    )
    body = {"prompt": "Omega: " + PROMPT, "max_tokens": 2, "stream": True, "stream_options": {"include_usage": True}}
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(post, sim.url + "/v1/completions", {**body, "stream": False})
        time.sleep(0.05)  # admitted while the first one is still prefilling (~0.33 s)
        t0 = time.perf_counter()
        second = pool.submit(post, sim.url + "/v1/completions", {**body, "stream": False})
        (_, r1), (_, r2) = first.result(), second.result()
        waited = time.perf_counter() - t0
    n = r1["usage"]["prompt_tokens"]
    assert r1["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert r2["usage"]["prompt_tokens_details"]["cached_tokens"] == (n - 1) // 16 * 16
    assert waited < 2 * n / 2000  # it waited for the first prefill, then computed less than a block


def test_prefill_slows_running_decodes(thread_sim_factory: Any) -> None:
    """--prefill-interference with shared prefill: decode steps are slower while another request prefills."""
    sim: Sim = thread_sim_factory(
        "--prefill-tokens-per-second", "1000", "--prefill-interference", "3", "--inter-token-latency", "0.01",
        "--prefill-overhead", "0.001", "--max-num-seqs", "4", events=False,
    )  # fmt: skip
    short = {"prompt": "hello", "max_tokens": 30}

    def e2e(body: dict[str, Any]) -> float:
        t0 = time.perf_counter()
        assert post(sim.url + "/v1/completions", body)[0] == 200
        return time.perf_counter() - t0

    alone = e2e(short)  # ~0.3 s of decode
    with ThreadPoolExecutor(2) as pool:
        f = pool.submit(e2e, short)
        time.sleep(0.05)
        pool.submit(e2e, {"prompt": "Gamma: " + PROMPT, "max_tokens": 1})  # ~0.65 s of prefill
        disturbed = f.result()
    assert alone < 0.6
    assert disturbed > 2 * alone


def test_time_scale_compresses_every_duration(thread_sim_factory: Any) -> None:
    sim: Sim = thread_sim_factory(
        "--inter-token-latency", "0.04", "--prefill-overhead", "0.001", "--time-scale", "0.25", events=False
    )
    t0 = time.perf_counter()
    assert post(sim.url + "/v1/completions", {"prompt": "hello", "max_tokens": 21})[0] == 200
    took = time.perf_counter() - t0
    assert 20 * 0.04 * 0.25 * 0.95 <= took < 20 * 0.04 * 0.6
