"""Failure injection (flags and /admin endpoints) and robustness of the request path."""

from __future__ import annotations

import socket
import time
from typing import Any

from e2e.sim.launch import Sim, SimProcess

from .helpers import get, post
from .test_metrics import scrape, value, wait_for

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
BODY = {"prompt": "hello", "max_tokens": 2}


def test_error_rate_by_flag_and_admin(thread_sim_factory: Any) -> None:
    sim: Sim = thread_sim_factory("--failure-rate", "1", "--failure-status", "429", events=False)
    status, err = post(sim.url + "/v1/completions", BODY)
    assert status == 429 and err["error"]["type"] == "RateLimitError"
    assert get(sim.url + "/health")[0] == 200
    status, state = post(sim.url + "/admin/config", {"failure_rate": 0.5, "failure_status": 500})
    assert status == 200 and state["config"]["failure_rate"] == 0.5
    codes = [post(sim.url + "/v1/completions", {"prompt": "x", "max_tokens": 1})[0] for _ in range(30)]
    assert set(codes) == {200, 500}
    post(sim.url + "/admin/config", {"failure_rate": 0})
    assert post(sim.url + "/v1/completions", BODY)[0] == 200
    status, err = post(sim.url + "/admin/config", {"block_size": 32})
    assert status == 400 and "cannot be changed" in err["error"]["message"]


def test_events_off_by_flag(thread_sim_factory: Any) -> None:
    from e2e.sim.testing import EventSubscriber, replay

    sim: Sim = thread_sim_factory("--kv-events-mode", "lossy")
    sub = EventSubscriber(sim.event_endpoint or "")
    try:
        post(sim.url + "/v1/completions", {"prompt": "hello " * 40, "max_tokens": 1})
        assert sub.drain() == [] and [f.seq for f in replay(sim.replay_endpoint or "", 0)] == [0]
    finally:
        sub.close()


def test_slow_start_and_unready(thread_sim_factory: Any) -> None:
    sim: Sim = thread_sim_factory("--startup-delay", "1.0", events=False, wait_healthy=False)
    assert get(sim.url + "/health")[0] == 503
    assert post(sim.url + "/v1/completions", BODY)[0] == 503
    sim.wait_healthy(5)
    assert post(sim.url + "/v1/completions", BODY)[0] == 200
    post(sim.url + "/admin/unready", {"seconds": 30})
    assert get(sim.url + "/health")[0] == 503
    post(sim.url + "/admin/unready", {"seconds": 0})
    assert get(sim.url + "/health")[0] == 200


def test_crash_by_admin_and_by_flag(sim_factory: Any) -> None:
    sim: SimProcess = sim_factory(events=False)
    late: SimProcess = sim_factory("--crash-after", "2", events=False)
    status, _ = post(sim.url + "/admin/crash", {})
    assert status == 200
    wait_for(lambda: not sim.alive(), timeout=5)
    assert sim.proc.returncode == 1
    wait_for(lambda: not late.alive(), timeout=10)
    assert late.proc.returncode == 1


def test_client_disconnect_mid_stream_frees_the_seat(thread_sim_factory: Any) -> None:
    sim: Sim = thread_sim_factory("--inter-token-latency", "0.05", "--max-num-seqs", "1", events=False)
    raw = b'{"prompt": "hello", "max_tokens": 200, "stream": true}'
    s = socket.create_connection(("127.0.0.1", sim.http_port))
    s.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(raw)}\r\n\r\n".encode()
        + raw
    )
    got = b""
    while b"data: " not in got:  # headers first, then the first SSE chunk
        data = s.recv(4096)
        assert data, "connection closed before the first chunk"
        got += data
    assert value(scrape(sim), "vllm:num_requests_running", model_name=MODEL) == 1
    s.close()
    wait_for(lambda: value(scrape(sim), "vllm:num_requests_running", model_name=MODEL) == 0, timeout=3)
    t0 = time.perf_counter()
    assert post(sim.url + "/v1/completions", BODY)[0] == 200  # the seat is free again
    assert time.perf_counter() - t0 < 1
    assert value(scrape(sim), "vllm:kv_cache_usage_perc", model_name=MODEL) == 0


def test_big_prompt_tokenization_does_not_stall_the_loop(thread_sim_factory: Any) -> None:
    import threading

    sim: Sim = thread_sim_factory(events=False)
    big = "Lorem ipsum dolor sit amet, consectetur adipiscing elit. " * 10000
    result: dict[str, Any] = {}

    def tokenize() -> None:
        t0 = time.perf_counter()
        result["status"], result["body"] = post(sim.url + "/tokenize", {"prompt": big})
        result["seconds"] = time.perf_counter() - t0

    th = threading.Thread(target=tokenize)
    th.start()
    latencies = []
    while th.is_alive():
        t0 = time.perf_counter()
        assert get(sim.url + "/health")[0] == 200
        latencies.append(time.perf_counter() - t0)
    th.join()
    assert result["status"] == 200 and result["body"]["count"] > 90_000
    assert len(latencies) >= 3 and max(latencies) < result["seconds"] / 2


def test_kv_capacity_changes_at_run_time_while_idle(thread_sim_factory: Any) -> None:
    sim = thread_sim_factory("--num-gpu-blocks", "64", events=False)
    status, state = post(sim.url + "/admin/config", {"num_gpu_blocks": 32})
    assert status == 200 and state["config"]["num_gpu_blocks"] == 32
    # a prompt needing more than 32 blocks of 16 tokens is now rejected as too large for the cache
    status, err = post(sim.url + "/v1/completions", {"prompt": "word " * 600, "max_tokens": 1})
    assert status == 400 and "blocks" in err["error"]["message"]
    assert post(sim.url + "/admin/config", {"num_gpu_blocks": 0})[0] == 409
