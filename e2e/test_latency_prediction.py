"""Predicted latency end to end: Envoy + EPP (predicted-latency-producer, latency-scorer) + 2 simulators, one of
them 8x slower at prefill and 5x at decode. The EPP measures TTFT and TPOT from the real response streams it
proxies, learns per-pod models, and once they are fit routes to the pod predicted faster."""

from __future__ import annotations

import http.client
import json
import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.harness.http import metric_value
from e2e.harness.stack import Stack, start_stack
from e2e.sim.launch import SimProcess, start_simulators
from epp.tokenization.qwen import QWEN25_MODEL

pytestmark = pytest.mark.e2e

WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "eta",
    "theta",
    "iota",
    "kappa",
    "lambda",
    "mu",
    "nu",
    "xi",
    "omicron",
    "pi",
    "rho",
    "sigma",
    "tau",
]


def config(sims: list[SimProcess]) -> str:
    lines = [
        "plugins:",
        "  - type: predicted-latency-producer",
        "    parameters: {streamingMode: true, minSamples: 8}",
        "  - type: latency-scorer",
        "  - type: max-score-picker",
        "schedulingProfiles:",
        "  - name: default",
        "    plugins: [{pluginRef: latency-scorer}, {pluginRef: max-score-picker}]",
        "endpoints:",
    ]
    lines += [f"  - {{name: sim{i}, address: {s.host}, port: {s.http_port}}}" for i, s in enumerate(sims)]
    return "\n".join(lines) + "\n"


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[Stack, list[SimProcess]]]:
    def slow(i: int) -> list[str]:
        return ["--prefill-time-per-token", "0.0016", "--inter-token-latency", "0.01"] if i == 1 else []

    base = ["--model", QWEN25_MODEL, "--prefill-time-per-token", "0.0002", "--inter-token-latency", "0.002"]
    with start_simulators(2, base_args=base, per_sim_args=slow, events=False, timeout=180.0) as sims:
        st = start_stack(tmp_path, backends=[], config=config(sims))
        try:
            yield st, sims
        finally:
            st.close()


def stream(url: str, prompt: str) -> tuple[int, float, int]:
    """A streamed completion: (serving sim's port, client-side TTFT in s, SSE data events)."""
    u = url.split("//", 1)[1]
    host, port = u.split(":")
    body = {
        "model": QWEN25_MODEL,
        "prompt": prompt,
        "max_tokens": 8,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        t0 = time.monotonic()
        conn.request(
            "POST", "/v1/completions", body=json.dumps(body).encode(), headers={"content-type": "application/json"}
        )
        r = conn.getresponse()
        assert r.status == 200, r.read()
        served = int(r.getheader("x-inference-port") or 0)
        first = 0.0
        events = 0
        while line := r.readline():
            if line.startswith(b"data: "):
                events += 1
                if not first:
                    first = time.monotonic() - t0
        return served, first, events
    finally:
        conn.close()


def test_ttft_and_tpot_are_learned_from_real_streams_and_route(stack: tuple[Stack, list[SimProcess]]) -> None:
    st, sims = stack
    fast, slow = sims[0].http_port, sims[1].http_port
    rng = random.Random(5)
    served: list[int] = []
    client_ttft: list[float] = []
    n = 60
    for i in range(n):
        prompt = f"Request {i}: " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(150, 400)))
        port, ttft, events = stream(st.url, prompt)
        assert events >= 9  # 8 tokens, the usage event, [DONE]
        served.append(port)
        client_ttft.append(ttft)
    text = st.epp.metrics_text()
    # every stream was measured: one TTFT and one TPOT sample each
    assert metric_value(text, "pyepp_latency_model_samples_total", {"target": "ttft"}) == n
    assert metric_value(text, "pyepp_latency_model_samples_total", {"target": "tpot"}) == n
    count = metric_value(text, "inference_objective_request_ttft_seconds_count")
    total = metric_value(text, "inference_objective_request_ttft_seconds_sum")
    assert count == n
    # the EPP's TTFT (pick → first body chunk at the EPP) is within the client's (send → first event)
    assert 0 < total / count <= sum(client_ttft) / n
    assert metric_value(text, "pyepp_latency_predictions_total", {"outcome": "cold"}) >= 1  # it started cold
    predicted = metric_value(text, "pyepp_latency_predictions_total", {"outcome": "predicted"})
    assert predicted >= n - 20
    # both pods were measured while cold (the fallback spreads), then the fast pod wins on prediction
    assert slow in served[:20] and fast in served[:20]
    late = served[-20:]
    assert late.count(fast) >= 18, late
    # its TTFT model is fit: the pooled error stays small
    assert metric_value(text, "pyepp_latency_model_error_ratio", {"target": "ttft", "endpoint": "sim0"}) < 0.5
