"""P/D disaggregation end to end: Envoy → EPP (the anchors' P/D config, unchanged) → the decode pod's routing
sidecar → prefill on a prefill simulator, decode on the local simulator with the returned kv_transfer_params.

Two prefill pods (simulators, role prefill) and two decode pods (simulator + `python -m epp.sidecar`, the endpoint
being the sidecar). Asserted from both pods' metrics, the sidecar's metrics and the response.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from e2e.harness.http import metric_value, post_json, post_json_lines
from e2e.harness.ports import free_ports
from e2e.harness.sidecar import SidecarProcess, start_sidecar
from e2e.harness.stack import Stack, start_stack
from e2e.sim.launch import SimProcess, start_simulators
from epp.tokenization.qwen import QWEN25_MODEL

pytestmark = pytest.mark.e2e

CONFIG_DIR = Path(__file__).resolve().parents[1] / "config"
ROLE = "llm-d.ai/role"
LONG = "Please read this long service agreement and summarise the obligations of each party. " * 30
SIM_ARGS = ["--model", QWEN25_MODEL, "--block-size", "16", "--prefill-time-per-token", "0.0002"]


@dataclass
class PD:
    stack: Stack
    prefill: list[SimProcess]
    decode: list[SimProcess]
    sidecars: list[SidecarProcess]

    def sim_metric(self, sim: SimProcess, name: str) -> float:
        return metric_value(_get(sim.url + "/metrics"), name, default=0.0)


def _get(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=5) as r:
        text: str = r.read().decode()
    return text


def pd_config(sample: str, prefill: list[SimProcess], sidecars: list[SidecarProcess]) -> str:
    lines = [(CONFIG_DIR / sample).read_text(), "endpoints:"]
    for i, s in enumerate(prefill):
        lines.append(f"  - {{name: prefill-{i}, address: 127.0.0.1, port: {s.http_port}, labels: {{{ROLE}: prefill}}}}")
    for i, c in enumerate(sidecars):
        lines.append(f"  - {{name: decode-{i}, address: 127.0.0.1, port: {c.port}, labels: {{{ROLE}: decode}}}}")
    return "\n".join(lines) + "\n"


@dataclass
class Pods:
    workdir: Path
    prefill: list[SimProcess]
    decode: list[SimProcess]
    sidecars: list[SidecarProcess]


@pytest.fixture(scope="module")
def pods(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pods]:
    workdir = tmp_path_factory.mktemp("pd")
    with start_simulators(
        4,
        base_args=SIM_ARGS,
        per_sim_args=lambda i: ["--role", "prefill" if i < 2 else "decode"],
        events=False,
        timeout=180,  # a loaded CI box can take a minute to start four tokenizers
    ) as sims:
        prefill, decode = sims[:2], sims[2:]
        allowed = "--allowed-prefillers=127.0.0.1"
        sidecars = [
            start_sidecar(workdir, s.http_port, "--kv-connector", "nixlv2", "--enable-ssrf-protection", allowed,
                          "--prefill-timeout", "5s")
            for s in decode
        ]  # fmt: skip
        try:
            yield Pods(workdir, prefill, decode, sidecars)
        finally:
            for c in sidecars:
                c.stop()


@pytest.fixture(scope="module")
def pd(pods: Pods) -> Iterator[PD]:
    stack = start_stack(pods.workdir, backends=[], config=pd_config("llm-d-pd.yaml", pods.prefill, pods.sidecars))
    try:
        yield PD(stack, pods.prefill, pods.decode, pods.sidecars)
    finally:
        stack.close()


def chat(url: str, text: str, headers: dict[str, str] | None = None, max_tokens: int = 4) -> dict[str, object]:
    r = post_json(
        url + "/v1/chat/completions",
        {"model": QWEN25_MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens},
        headers=headers,
    )
    assert r.status == 200, r.body
    out = r.json()
    out["_served_port"] = int(r.headers["x-inference-port"])
    return out


def totals(pd: PD, name: str, sims: list[SimProcess]) -> float:
    return sum(pd.sim_metric(s, name) for s in sims)


def test_long_uncached_prompt_goes_prefill_then_decode(pd: PD) -> None:
    before_p = totals(pd, "sim:remote_decode_requests_total", pd.prefill)
    before_d = totals(pd, "sim:remote_prefill_requests_total", pd.decode)
    out = chat(pd.stack.url, LONG + " Question: who pays?")
    assert out["_served_port"] in {s.http_port for s in pd.decode}  # decoded on a decode pod
    usage = out["usage"]
    assert isinstance(usage, dict) and usage["completion_tokens"] == 4 and usage["prompt_tokens"] > 300
    assert totals(pd, "sim:remote_decode_requests_total", pd.prefill) == before_p + 1  # a prefill pod prefilled
    assert totals(pd, "sim:remote_prefill_requests_total", pd.decode) == before_d + 1  # the decode pod pulled KV
    disagg = sum(metric_value(c.metrics_text(), "pd_sidecar_requests_total", {"mode": "disaggregated"}, 0.0)
                 for c in pd.sidecars)  # fmt: skip
    assert disagg >= 1
    text = pd.stack.epp.metrics_text()
    assert metric_value(text, "llm_d_epp_disagg_decision_total", {"decision_type": "prefill-decode"}) >= 1


def test_cached_or_short_prompt_stays_on_the_decode_pod(pd: PD) -> None:
    prompt = LONG + " Question: when does it end?"
    first = chat(pd.stack.url, prompt)
    time.sleep(0.2)
    before = totals(pd, "sim:remote_decode_requests_total", pd.prefill)
    again = chat(pd.stack.url, prompt)
    assert again["_served_port"] == first["_served_port"]
    short = chat(pd.stack.url, "hi")
    assert short["_served_port"] in {s.http_port for s in pd.decode}
    assert totals(pd, "sim:remote_decode_requests_total", pd.prefill) == before  # neither went to a prefill pod
    usage = again["usage"]
    assert isinstance(usage, dict) and usage["prompt_tokens_details"]["cached_tokens"] > 300


def test_forged_prefiller_header_is_dropped(pd: PD) -> None:
    before = sum(metric_value(c.metrics_text(), "pd_sidecar_rejected_total", default=0.0) for c in pd.sidecars)
    forged = {"x-prefiller-host-port": "169.254.169.254:80", "x-encoder-hosts-ports": "10.9.9.9:1"}
    short = chat(pd.stack.url, "hello", headers=forged)  # no disaggregation: the header is removed
    assert short["_served_port"] in {s.http_port for s in pd.decode}
    prefills = totals(pd, "sim:remote_decode_requests_total", pd.prefill)
    long = chat(pd.stack.url, "Forged-header document. " + LONG, headers=forged)  # disaggregated: ours replaces it
    assert long["_served_port"] in {s.http_port for s in pd.decode}
    assert totals(pd, "sim:remote_decode_requests_total", pd.prefill) == prefills + 1
    after = sum(metric_value(c.metrics_text(), "pd_sidecar_rejected_total", default=0.0) for c in pd.sidecars)
    assert after == before  # the sidecars never saw the forged prefiller (it would be a 403)


def test_sidecar_refuses_bad_prefillers_directly(pd: PD) -> None:
    c = pd.sidecars[0]
    body = {"model": QWEN25_MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 1}
    r = post_json(c.url + "/v1/chat/completions", body, headers={"x-prefiller-host-port": "10.1.2.3:8000"})
    assert r.status == 403 and b"SSRF" in r.body
    r = post_json(c.url + "/v1/chat/completions", body, headers={"x-prefiller-host-port": "no port here"})
    assert r.status == 400 and b"malformed" in r.body
    assert "SSRF protection: prefill target 10.1.2.3:8000 not in the allowlist" in c.log_text()


def test_dead_prefiller_falls_back_to_local_prefill(pd: PD) -> None:
    c = pd.sidecars[1]
    body = {"model": QWEN25_MODEL, "messages": [{"role": "user", "content": LONG + " dead"}], "max_tokens": 3}
    (dead,) = free_ports(1)  # nothing listens there
    t0 = time.monotonic()
    r = post_json(c.url + "/v1/chat/completions", body, headers={"x-prefiller-host-port": f"127.0.0.1:{dead}"})
    assert r.status == 200 and r.json()["usage"]["completion_tokens"] == 3
    assert time.monotonic() - t0 < 5
    assert metric_value(c.metrics_text(), "pd_sidecar_prefill_fallbacks_total", {"reason": "unreachable"}) >= 1
    assert "prefilling locally" in c.log_text()


def test_slow_prefiller_times_out_and_falls_back(pd: PD) -> None:
    c, slow = pd.sidecars[0], pd.prefill[0]
    assert post_json(slow.url + "/admin/config", {"prefill_overhead": 30.0}).status == 200
    try:
        body = {"model": QWEN25_MODEL, "messages": [{"role": "user", "content": LONG + " slow"}], "max_tokens": 2}
        t0 = time.monotonic()
        r = post_json(c.url + "/v1/chat/completions", body, headers={"x-prefiller-host-port": slow.hostport})
        elapsed = time.monotonic() - t0
    finally:
        post_json(slow.url + "/admin/config", {"prefill_overhead": 0.01})
    assert r.status == 200 and 4.5 < elapsed < 15  # --prefill-timeout 5s, then the local prefill
    assert metric_value(c.metrics_text(), "pd_sidecar_prefill_fallbacks_total", {"reason": "timeout"}) >= 1


def test_prefiller_without_kv_transfer_params_falls_back(pd: PD) -> None:
    c, odd = pd.sidecars[0], pd.prefill[1]
    assert post_json(odd.url + "/admin/config", {"omit_kv_transfer_params": True}).status == 200
    try:
        body = {"model": QWEN25_MODEL, "messages": [{"role": "user", "content": LONG + " no params"}], "max_tokens": 2}
        r = post_json(c.url + "/v1/chat/completions", body, headers={"x-prefiller-host-port": odd.hostport})
    finally:
        post_json(odd.url + "/admin/config", {"omit_kv_transfer_params": False})
    assert r.status == 200 and r.json()["usage"]["completion_tokens"] == 2
    reason = {"reason": "no_kv_transfer_params"}
    assert metric_value(c.metrics_text(), "pd_sidecar_prefill_fallbacks_total", reason) >= 1
    assert "the prefiller returned no kv_transfer_params" in c.log_text()


def test_failing_prefiller_is_retried_then_falls_back(pd: PD, tmp_path: Path) -> None:
    """5xx from the prefiller: `--prefill-max-retries` more attempts after `--prefill-retry-backoff`, then a local
    prefill (counted), not an error to the client."""
    flaky = pd.prefill[1]
    c = start_sidecar(tmp_path, pd.decode[0].http_port, "--prefill-max-retries", "2", "--prefill-retry-backoff", "20ms")
    assert post_json(flaky.url + "/admin/config", {"failure_rate": 1.0, "failure_status": 503}).status == 200
    try:
        body = {"model": QWEN25_MODEL, "messages": [{"role": "user", "content": LONG + " flaky"}], "max_tokens": 2}
        r = post_json(c.url + "/v1/chat/completions", body, headers={"x-prefiller-host-port": flaky.hostport})
        text = c.metrics_text()
    finally:
        post_json(flaky.url + "/admin/config", {"failure_rate": 0.0})
        c.stop()
    assert r.status == 200 and r.json()["usage"]["completion_tokens"] == 2
    assert metric_value(text, "pd_sidecar_prefill_retries_total") == 2
    assert metric_value(text, "pd_sidecar_prefill_fallbacks_total", {"reason": "status_5xx"}) == 1


def test_streaming_disaggregated_request_streams_through(pd: PD) -> None:
    before = totals(pd, "sim:remote_prefill_requests_total", pd.decode)
    body = {"model": QWEN25_MODEL, "messages": [{"role": "user", "content": LONG + " stream it"}], "max_tokens": 12,
            "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    status, lines = post_json_lines(pd.stack.url + "/v1/chat/completions", body)
    assert status == 200
    data = [line for _, line in lines if line.startswith(b"data: ")]
    assert data[-1].strip() == b"data: [DONE]" and b'"usage"' in data[-2]
    assert sum(b'"content"' in d for d in data) >= 12  # the role chunk + 12 tokens, as the engine sent them
    assert totals(pd, "sim:remote_prefill_requests_total", pd.decode) == before + 1  # decoded from pulled KV


@pytest.mark.parametrize(
    ("sample", "disaggregates"),
    [
        ("llm-d-sim-pd.yaml", True),
        ("llm-d-pd-deprecated.yaml", True),
        ("llm-d-epd.yaml", True),
        ("llm-d-sim-e-pd.yaml", False),
    ],
)
def test_anchor_sample_configs_run_against_the_simulators(pods: Pods, sample: str, disaggregates: bool) -> None:
    """The anchors' other P/D / E/P/D sample configs, unchanged, route a fresh long prompt through Envoy."""
    stack = start_stack(pods.workdir, backends=[], config=pd_config(sample, pods.prefill, pods.sidecars))
    try:
        pd = PD(stack, pods.prefill, pods.decode, pods.sidecars)
        before = totals(pd, "sim:remote_decode_requests_total", pods.prefill)
        out = chat(stack.url, f"Sample {sample} reads a fresh document. " + LONG)
        assert out["_served_port"] in {s.http_port for s in pods.decode}
        assert totals(pd, "sim:remote_decode_requests_total", pods.prefill) == before + int(disaggregates)
    finally:
        stack.close()


def test_prefill_pods_down_through_envoy(pd: PD) -> None:
    """Last (it stops the prefill pods): the client gets its answer from a decode pod either way — the sidecar
    falls back to a local prefill while the EPP still picks a dead prefiller, and once the EPP's scrapes mark
    them unhealthy it stops sending prefill work (decode-only)."""

    def fallbacks() -> float:
        return sum(
            metric_value(c.metrics_text(), "pd_sidecar_prefill_fallbacks_total", {"reason": "unreachable"}, 0.0)
            for c in pd.sidecars
        )

    def decode_only() -> float:
        text = pd.stack.epp.metrics_text()
        return metric_value(text, "llm_d_epp_disagg_decision_total", {"decision_type": "decode-only"}, 0.0)

    for s in pd.prefill:
        s.kill()
    for i in range(3):
        before = (fallbacks(), decode_only())
        out = chat(pd.stack.url, f"A new document {i}, never seen before. " + LONG)  # uncached: P/D wanted
        assert out["_served_port"] in {s.http_port for s in pd.decode}
        after = (fallbacks(), decode_only())
        assert (after[0] - before[0]) + (after[1] - before[1]) == 1, (before, after)
        time.sleep(0.5)
