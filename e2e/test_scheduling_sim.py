"""Scheduling against real simulator processes: the scrapers read their vLLM metrics, and with GIE's default
config a loaded simulator stops receiving requests through a real Envoy (and gets them again once drained)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from e2e.harness.backends import Backend
from e2e.harness.http import metric_value
from e2e.harness.stack import Stack
from e2e.sim.fixtures import SimFactory, sim_factory  # noqa: F401  (fixture)
from e2e.sim.launch import SimProcess, start_simulators
from epp.config.loader import GIE_DEFAULT_PLUGINS_YAML
from epp.datalayer.datastore import Datastore
from epp.datalayer.scraper import MetricsScraper
from epp.framework import Endpoint
from epp.tokenization.qwen import QWEN25_MODEL

pytestmark = pytest.mark.e2e


def post(url: str, body: dict[str, Any], timeout: float = 60.0) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()
    except OSError as e:  # load requests still running when their simulator is stopped
        return 0, {}, str(e).encode()


def state(sim: SimProcess) -> dict[str, Any]:
    with urllib.request.urlopen(sim.url + "/admin/state", timeout=5) as r:
        data: dict[str, Any] = json.loads(r.read())
        return data


def start_load(sim: SimProcess, n: int, max_tokens: int, model: str = QWEN25_MODEL) -> list[threading.Thread]:
    """n concurrent long completions sent straight to the simulator (not through the gateway)."""
    body = {"model": model, "prompt": "load " * 20, "max_tokens": max_tokens}
    threads = [threading.Thread(target=post, args=(sim.url + "/v1/completions", body), daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    return threads


def wait_until(cond: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


async def test_scraper_reads_simulator_metrics(sim_factory: SimFactory) -> None:  # noqa: F811
    sim = sim_factory(
        "--max-num-seqs", "2", "--inter-token-latency", "0.02", "--num-gpu-blocks", "512",
        "--lora-modules", "sql-lora", "--max-loras", "2", events=False, replay=False,
    )  # fmt: skip
    ds = Datastore()
    ep = Endpoint("sim", "127.0.0.1", sim.http_port)
    ds.upsert(ep)
    scraper = MetricsScraper(ds, interval=0.05)
    task = asyncio.create_task(scraper.run())
    try:
        for _ in range(200):
            if ep.metrics.update_time > 0:
                break
            await asyncio.sleep(0.02)
        m = ep.metrics
        assert (m.waiting_queue_size, m.running_requests_size, m.cache_block_size, m.cache_num_blocks) == (
            0,
            0,
            16,
            512,
        )
        assert m.max_active_models == 2
        await asyncio.to_thread(start_load, sim, 6, 100, "sql-lora")  # 3 rounds of 2 s; not awaited
        for _ in range(250):
            st = await asyncio.to_thread(state, sim)
            m = ep.metrics
            if st["waiting"] == 4 and m.waiting_queue_size == 4 and m.running_requests_size == 2:
                break
            await asyncio.sleep(0.02)
        assert (m.running_requests_size, m.waiting_queue_size) == (2, 4)
        assert "sql-lora" in m.active_models and m.kv_cache_usage_percent > 0
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        sim.kill()  # the load still running does not matter here


def static_endpoints_only(backends: list[Backend]) -> str:
    """The endpoints (and fast pool gauges) with GIE's built-in default plugins, named: without a plugin section
    the EPP now runs pyepp's default, which balances the load it routed itself, not a scraped queue."""
    eps = "".join(f"- {{name: {b.name}, address: {b.host}, port: {b.port}}}\n" for b in backends)
    return "refreshPrometheusMetricsInterval: 200ms\nendpoints:\n" + eps + GIE_DEFAULT_PLUGINS_YAML


def served_by(stack: Stack, n: int) -> Counter[int]:
    seen: Counter[int] = Counter()
    for i in range(n):
        status, headers, body = post(
            stack.url + "/v1/completions", {"model": QWEN25_MODEL, "prompt": f"question {i}", "max_tokens": 2}
        )
        assert status == 200, body
        seen[int(headers["x-inference-port"])] += 1
    return seen


def test_loaded_simulator_stops_receiving_requests(stack_factory: Callable[..., Stack]) -> None:
    args = ["--max-num-seqs", "2", "--inter-token-latency", "0.01"]
    with start_simulators(3, base_args=args, events=False, replay=False) as sims:
        backends = [Backend(f"sim{i}", "127.0.0.1", s.http_port) for i, s in enumerate(sims)]
        # GIE's default scheduling (no plugins section): queue x2, kv-cache utilization x2, prefix x3.
        stack = stack_factory(backends=backends, config=static_endpoints_only)
        loaded = sims[0]
        before = served_by(stack, 12)
        assert set(before) == {s.http_port for s in sims}, before  # idle: equal scores, ties rotate

        threads = start_load(loaded, 8, max_tokens=100)  # 2 running + 6 waiting: 4 rounds of ~1 s
        wait_until(lambda: state(loaded)["waiting"] >= 5)
        time.sleep(0.2)  # a few 50 ms scrape intervals
        during = served_by(stack, 20)
        assert loaded.http_port not in during, during
        assert state(loaded)["waiting"] >= 1  # still loaded when the last request was routed

        for t in threads:
            t.join(60)
        wait_until(lambda: state(loaded)["waiting"] == 0 and state(loaded)["running"] == 0)
        time.sleep(0.2)
        after = served_by(stack, 12)
        assert loaded.http_port in after, after  # drained: it gets requests again

        text = stack.epp.metrics_text()  # the scheduler's and data layer's self-metrics, GIE names
        assert metric_value(text, "inference_pool_ready_pods", {"name": "default"}) == 3
        assert metric_value(text, "inference_extension_scheduler_attempts_total", {"status": "success"}) >= 44
        assert metric_value(text, "inference_extension_scheduler_e2e_duration_seconds_count") >= 44
        sampled = {"extension_point": "Scorer", "plugin_name": "queue-scorer"}  # 1 cycle in 16 is timed
        assert metric_value(text, "inference_extension_plugin_duration_seconds_count", sampled) >= 2
        stack.close()
