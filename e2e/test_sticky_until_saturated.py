"""llm-d's "sticky until saturated" default through real Envoy and four simulators, with llm-d's own sample config
(config/llm-d-optimized-baseline.yaml, the optimized-baseline guide's plugin list, unchanged; only the static
endpoints are appended): approx-prefix-cache-producer → prefix-cache-affinity-filter (0.80, 18 s TTFT gate at 15928
tokens/s) → token-load-scorer, both fed by the inflight-load-producer.

1. Sticky: requests sharing a long prefix all go to the pod that served the first one, and that pod reuses its cache.
2. Saturated: once that pod has more than 18 s of queued prefill in flight (the EPP's own count, > 286,720 uncached
   tokens: six long requests queued behind one another, one sequence at a time), the next request sharing the
   prefix goes to another pod: the TTFT gate broke stickiness. The in-flight gauges show the load while it lasts.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.harness.http import metric_value, post_json
from e2e.harness.stack import Stack, start_stack
from e2e.sim.launch import SimProcess, start_simulators
from epp.tokenization.qwen import QWEN25_MODEL

pytestmark = pytest.mark.e2e

SAMPLE = Path(__file__).resolve().parents[1] / "config" / "llm-d-optimized-baseline.yaml"
WORDS = [
    "supplier",
    "goods",
    "delivery",
    "clause",
    "warranty",
    "invoice",
    "payment",
    "damages",
    "notice",
    "termination",
    "party",
    "court",
]


def text(n_chars: int, seed: int) -> str:
    rng = random.Random(seed)
    out: list[str] = []
    size = 0
    while size < n_chars:
        w = rng.choice(WORDS)
        out.append(w)
        size += len(w) + 1
    return " ".join(out)


# 20,000 characters: past the approximate producer's 256 indexed blocks of 64 characters, so a prompt that starts
# with it matches every indexed block on the pod that holds it (score 1.0, sticky).
PREFIX = text(20_000, 1)


def config(sims: list[SimProcess]) -> str:
    endpoints = "".join(f"- {{name: sim{i}, address: {s.host}, port: {s.http_port}}}\n" for i, s in enumerate(sims))
    return SAMPLE.read_text() + "endpoints:\n" + endpoints


@pytest.fixture
def sticky_stack(tmp_path: Path) -> Iterator[tuple[Stack, list[SimProcess]]]:
    args = ["--max-num-seqs", "1", "--max-model-len", "131072", "--num-gpu-blocks", "20000", "--model", QWEN25_MODEL]
    with start_simulators(4, base_args=args, events=False, replay=False) as sims:
        stack = start_stack(tmp_path, backends=[], config=config(sims))
        try:
            yield stack, sims
        finally:
            stack.close()


def complete(url: str, prompt: str, max_tokens: int = 2, timeout: float = 60.0) -> tuple[int, int]:
    r = post_json(
        url + "/v1/completions", {"model": QWEN25_MODEL, "prompt": prompt, "max_tokens": max_tokens}, timeout=timeout
    )
    assert r.status == 200, r.body
    return int(r.headers["x-inference-port"]), int(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])


def inflight_tokens(stack: Stack, name: str) -> float:
    return metric_value(stack.epp.metrics_text(), "llm_d_epp_inflight_tokens", {"endpoint_name": name}, default=0.0)


def test_sticky_until_saturated_with_llm_d_sample(sticky_stack: tuple[Stack, list[SimProcess]]) -> None:
    stack, sims = sticky_stack
    names = {s.http_port: f"sim{i}" for i, s in enumerate(sims)}

    # 1. sticky
    owner, _ = complete(stack.url, PREFIX + " Question 0: who pays shipping?")
    for i in range(1, 6):
        port, cached = complete(stack.url, PREFIX + f" Question {i}: what about damages?")
        assert port == owner, (i, names[port], names[owner])
        assert cached > 2000  # the simulator really reused the prefix (~2,500 tokens)
    assert inflight_tokens(stack, names[owner]) == 0  # every request released its tokens

    # 2. saturated: six long requests sharing the prefix queue on the owner (one sequence at a time); each adds
    # ~50k uncached tokens (the part past the indexed prefix) to the owner's in-flight count until its first chunk.
    flood: list[threading.Thread] = []
    for j in range(6):
        prompt = PREFIX + " " + text(200_000, 100 + j)
        t = threading.Thread(target=_quietly, args=(stack.url, prompt), daemon=True)
        t.start()
        flood.append(t)
    deadline = time.monotonic() + 30
    while inflight_tokens(stack, names[owner]) <= 286_720:
        assert time.monotonic() < deadline, inflight_tokens(stack, names[owner])
        time.sleep(0.05)
    assert all(inflight_tokens(stack, names[p]) == 0 for p in names if p != owner)
    port, _ = complete(stack.url, PREFIX + " Question 7: and termination?")
    assert port != owner, "the TTFT gate should have broken stickiness"
    text_ = stack.epp.metrics_text()
    assert metric_value(text_, "llm_d_epp_inflight_requests", {"endpoint_name": names[owner]}) >= 6


def _quietly(url: str, prompt: str) -> None:
    with contextlib.suppress(OSError):  # the simulators are stopped before the queue drains
        post_json(url + "/v1/completions", {"model": QWEN25_MODEL, "prompt": prompt, "max_tokens": 1}, timeout=120)
