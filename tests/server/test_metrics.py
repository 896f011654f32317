"""Client-chosen model names reach /metrics bounded and sanitised (issue 15: 4,000 names made an 89 MB page)."""

from __future__ import annotations

import asyncio
import threading
import time

import aiohttp
from prometheus_client import CollectorRegistry, generate_latest

from epp.framework.labels import OTHER, LabelBudget, sanitize_label
from epp.framework.types import Usage
from epp.server.metrics import RequestMetrics
from epp.server.metrics_http import MetricsHTTP


def model_labels(registry: CollectorRegistry) -> set[str]:
    out = set()
    for metric in registry.collect():
        for sample in metric.samples:
            if "model_name" in sample.labels:
                out.add(sample.labels["model_name"])
    return out


def test_unknown_model_names_fold_into_one_label_value() -> None:
    registry = CollectorRegistry()
    m = RequestMetrics(registry, labels=LabelBudget(limit=3, known=["configured"]))
    for i in range(50):
        name = f"attacker-{i}"
        m.request_started(name, name, 0, 10)
        m.request_error(name, name, "BadRequest")
        m.request_finished(name, name, 0.1, 5, Usage(prompt_tokens=1, completion_tokens=2, total_tokens=3))
    m.request_started("configured", "configured", 0, 10)
    assert model_labels(registry) == {"attacker-0", "attacker-1", "attacker-2", "configured", OTHER}
    get = registry.get_sample_value
    other = {"model_name": OTHER, "target_model_name": OTHER, "priority": "0"}
    assert get("inference_objective_request_total", other) == 47
    assert get("inference_objective_running_requests", {"model_name": OTHER}) == 0
    assert get("inference_objective_running_requests", {"model_name": "configured"}) == 1
    size = len(generate_latest(registry))
    for i in range(50, 500):  # more names: the page does not grow
        m.request_started(f"attacker-{i}", "t", 0, 10)
    assert len(generate_latest(registry)) - size < 200


def test_model_target_pairs_are_bounded_too() -> None:
    registry = CollectorRegistry()
    m = RequestMetrics(registry, labels=LabelBudget(limit=4))
    for a in range(4):
        for b in range(4):  # 4 admitted names, but 16 pairs
            m.request_started(f"n{a}", f"n{b}", 0, 1)
    pairs = {
        (s.labels["model_name"], s.labels["target_model_name"])
        for metric in registry.collect()
        for s in metric.samples
        if metric.name == "inference_objective_request"
    }
    assert len(pairs) <= 2 * 4 + 1 and (OTHER, OTHER) in pairs


def test_label_values_are_sanitised() -> None:
    assert sanitize_label("x\ud800y") == "x?y"
    assert sanitize_label("é" * 500) == "é" * 128
    registry = CollectorRegistry()
    m = RequestMetrics(registry, labels=LabelBudget(limit=10))
    m.request_started("x\ud800y", "x\ud800y", 0, 1)
    m.request_finished("x\ud800y", "x\ud800y", 0.1, 1, None)
    assert 'model_name="x?y"' in generate_latest(registry).decode()


async def test_metrics_are_rendered_off_the_event_loop() -> None:
    """A slow render (a big page) must not stall the loop: requests keep flowing during a scrape."""
    rendered_on: list[str] = []

    class SlowRender(MetricsHTTP):
        def render(self) -> bytes:
            rendered_on.append(threading.current_thread().name)
            time.sleep(0.5)
            return super().render()

    http = SlowRender(CollectorRegistry(), "127.0.0.1", 0)
    await http.start()
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.01)

    t = asyncio.create_task(ticker())
    try:
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{http.port}/metrics") as r:
            assert r.status == 200
            await r.read()
    finally:
        t.cancel()
        await http.stop()
    assert rendered_on and rendered_on[0] != threading.main_thread().name
    assert ticks >= 20  # the loop ran while the page was rendered (0.5 s at 10 ms a tick)


def test_request_counts_per_priority_through_the_kept_children() -> None:
    registry = CollectorRegistry()
    m = RequestMetrics(registry)
    for priority in (0, 0, 2, 0, -1, 2):
        m.request_started("m", "t", priority, 10)
    get = registry.get_sample_value
    counts = {p: get("inference_objective_request_total", {"model_name": "m", "target_model_name": "t",
                                                           "priority": str(p)}) for p in (0, 2, -1)}  # fmt: skip
    assert counts == {0: 3, 2: 2, -1: 1}
