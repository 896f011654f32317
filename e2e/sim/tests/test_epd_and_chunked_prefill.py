"""E/P/D: the encode role answers ec_transfer_params, other pods load what it names (or what it wrote to the shared
storage) instead of encoding; chunked prefill: a decode step carries the prefill chunk's compute."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from e2e.harness.http import metric_value
from e2e.sim.launch import Sim

from .helpers import get, post

IMAGE = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}


def chat(image: dict[str, Any], **extra: Any) -> dict[str, Any]:
    content = [{"type": "text", "text": "What is in this picture?"}, image]
    return {"messages": [{"role": "user", "content": content}], "max_tokens": 1, **extra}


def items(sim: Sim, source: str) -> float:
    return metric_value(get(sim.url + "/metrics")[1], "sim:encoder_items_total", {"source": source}, 0.0)


def timed(url: str, body: dict[str, Any]) -> tuple[float, int, Any]:
    t0 = time.monotonic()
    status, answer = post(url, body)
    return time.monotonic() - t0, status, answer


def test_encode_role_hands_its_items_to_the_prefill_pod(thread_sim_factory: Any) -> None:
    encoder: Sim = thread_sim_factory("--role", "encode", "--encode-time-per-item", "1.5", events=False)
    prefill: Sim = thread_sim_factory("--role", "prefill", "--encode-time-per-item", "1.5", events=False)
    status, answer = post(encoder.url + "/v1/chat/completions", chat(IMAGE))
    assert status == 200
    params = answer["ec_transfer_params"]
    assert len(params) == 1 and next(iter(params.values()))["remote_port"] == encoder.http_port
    assert items(encoder, "computed") == 1
    # The prefill pod given those params loads the item (1 ms) instead of encoding it (1.5 s).
    with_params, status, answer = timed(prefill.url + "/v1/chat/completions", chat(IMAGE, ec_transfer_params=params))
    assert status == 200 and "ec_transfer_params" not in answer  # only an encoder answers them
    assert items(prefill, "transferred") == 1 and items(prefill, "computed") == 0
    other = {"type": "image_url", "image_url": {"url": "https://example.com/dog.png"}}
    alone, _, _ = timed(prefill.url + "/v1/chat/completions", chat(other))
    assert items(prefill, "computed") == 1
    assert alone > 1.5 and with_params < alone - 1.0
    again, _, _ = timed(prefill.url + "/v1/chat/completions", chat(other))
    assert items(prefill, "cached") == 1 and again < alone - 1.0  # the pod's own encoder cache
    status, answer = post(prefill.url + "/v1/chat/completions", chat(IMAGE, ec_transfer_params=[1]))
    assert status == 400 and "ec_transfer_params" in answer["error"]["message"]


def test_shared_storage_encoder_cache(thread_sim_factory: Any, tmp_path: Path) -> None:
    shared = ("--ec-shared-storage-path", str(tmp_path / "ec"))
    encoder: Sim = thread_sim_factory("--role", "encode", *shared, events=False)
    decode: Sim = thread_sim_factory("--role", "decode", *shared, events=False)
    assert post(encoder.url + "/v1/chat/completions", chat(IMAGE))[0] == 200
    assert len(list((tmp_path / "ec").iterdir())) == 1
    assert post(decode.url + "/v1/chat/completions", chat(IMAGE))[0] == 200
    assert items(decode, "shared_storage") == 1 and items(decode, "computed") == 0


def test_chunked_prefill_stalls_decode_steps_by_the_chunk(thread_sim_factory: Any) -> None:
    """--max-num-batched-tokens with --prefill-tokens-per-second: a decode step taken while a prefill computes
    costs ITL + chunk / rate (2048 / 5,000 tok/s = 410 ms here), as vLLM's mixed steps; P/D removes it."""
    sim: Sim = thread_sim_factory(
        "--inter-token-latency", "0.01", "--prefill-tokens-per-second", "5000", "--max-num-batched-tokens", "2048",
        "--max-num-seqs", "8", events=False,
    )  # fmt: skip
    long_prompt = "word " * 12000  # ~12k tokens: 2.4 s of prefill in 6 chunks

    def decode_time() -> float:
        t0 = time.monotonic()
        post(sim.url + "/v1/completions", {"prompt": "hello", "max_tokens": 6})
        return time.monotonic() - t0

    alone = decode_time()
    with ThreadPoolExecutor(2) as pool:
        prefill = pool.submit(post, sim.url + "/v1/completions", {"prompt": long_prompt, "max_tokens": 1})
        time.sleep(0.3)
        together = pool.submit(decode_time).result()
        status, _ = prefill.result()
    assert status == 200
    assert together > alone + 3 * 0.4  # five decode steps, each next to a 2048-token chunk (0.41 s)
