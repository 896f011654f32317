"""P/D roles: a prefill pod answers kv_transfer_params with its block ids; a decode pod given them pulls the KV
(modelled transfer time, no prefill compute); both publish KV events; prefills slow decodes on the same pod."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from e2e.harness.http import metric_value
from e2e.sim.launch import Sim

from .helpers import post, stream_ttft

PROMPT = "A long contract clause that the model has to read before it answers anything at all. " * 40
REMOTE_DECODE = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


def metrics(sim: Sim) -> str:
    import urllib.request

    with urllib.request.urlopen(sim.url + "/metrics", timeout=5) as r:
        text: str = r.read().decode()
    return text


def test_prefill_then_remote_decode_skips_the_prefill_compute(thread_sim_factory: Any) -> None:
    slow = ("--prefill-overhead", "0.005", "--prefill-time-per-token", "0.0005", "--block-size", "16")
    prefill: Sim = thread_sim_factory(*slow, "--role", "prefill", events=False)
    decode: Sim = thread_sim_factory(
        *slow, "--role", "decode", "--kv-transfer-overhead", "0.002", "--kv-transfer-time-per-block", "0.0001",
        events=False,
    )  # fmt: skip
    body = {"prompt": PROMPT, "max_tokens": 1, "stream": False, "kv_transfer_params": REMOTE_DECODE}
    status, answer = post(prefill.url + "/v1/completions", body)
    assert status == 200
    params = answer["kv_transfer_params"]
    n = answer["usage"]["prompt_tokens"]
    assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
    assert len(params["remote_block_ids"]) == -(-n // 16) and params["remote_port"] == prefill.http_port
    assert metric_value(metrics(prefill), "sim:remote_decode_requests_total") == 1
    # Decode with the returned params: TTFT is the transfer (~2 ms + 0.1 ms/block), not n x 0.5 ms of compute.
    decode_body = {"prompt": PROMPT, "max_tokens": 2, "kv_transfer_params": params}
    remote_ttft, _ = stream_ttft(decode.url + "/v1/completions", decode_body)
    cold_ttft, _ = stream_ttft(decode.url + "/v1/completions", {"prompt": "x " + PROMPT, "max_tokens": 2})
    assert n > 500 and cold_ttft >= n * 0.0005 * 0.9
    assert remote_ttft < cold_ttft / 4
    m = metrics(decode)
    assert metric_value(m, "sim:remote_prefill_requests_total") == 1
    assert metric_value(m, "sim:kv_transfer_blocks_total") == len(params["remote_block_ids"])
    # The decode pod holds the prompt now: a repeat is a local cache hit.
    _, again = post(decode.url + "/v1/completions", {"prompt": PROMPT, "max_tokens": 1})
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] >= n - 16


def test_bad_kv_transfer_params_are_a_400(thread_sim_factory: Any) -> None:
    sim: Sim = thread_sim_factory(events=False)
    bad = {"do_remote_prefill": True, "remote_block_ids": "nope"}
    status, body = post(sim.url + "/v1/completions", {"prompt": "hi", "max_tokens": 1, "kv_transfer_params": bad})
    assert status == 400 and "remote_block_ids" in body["error"]["message"]
    status, _ = post(sim.url + "/v1/completions", {"prompt": "hi", "max_tokens": 1, "kv_transfer_params": [1]})
    assert status == 400


def test_prefills_slow_decoding_on_the_same_pod(thread_sim_factory: Any) -> None:
    sim: Sim = thread_sim_factory(
        "--inter-token-latency", "0.01", "--prefill-time-per-token", "0.002", "--prefill-interference", "2",
        "--max-num-seqs", "8", events=False,
    )  # fmt: skip

    def decode_time() -> float:
        t0 = time.monotonic()
        post(sim.url + "/v1/completions", {"prompt": "hello", "max_tokens": 30})
        return time.monotonic() - t0

    alone = decode_time()
    with ThreadPoolExecutor(3) as pool:
        long_prefills = [
            pool.submit(post, sim.url + "/v1/completions", {"prompt": f"{i} " + PROMPT, "max_tokens": 1})
            for i in range(2)
        ]
        time.sleep(0.05)
        together = pool.submit(decode_time).result()
        for f in long_prefills:
            f.result()
    assert together > alone * 1.8  # ITL x (1 + 2 x prefills running)
