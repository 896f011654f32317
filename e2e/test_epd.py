"""E/P/D end to end: Envoy → EPP (the anchor's `config/llm-d-epd.yaml`, unchanged) → the decode pod's sidecar
(`--ec-connector ec-nixl` or `ec-example`) → the image to the encode pod, the prefill (with what the encoder handed
over) to a prefill pod, the decode on the local simulator.

One encode simulator, two prefill, two decode (each behind a sidecar); every simulator shares one
`--ec-shared-storage-path` (vLLM's ECExampleConnector directory). Asserted from every pod's counters.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from e2e.harness.http import metric_value, post_json
from e2e.harness.ports import free_ports
from e2e.harness.sidecar import SidecarProcess, start_sidecar
from e2e.harness.stack import Stack, start_stack
from e2e.sim.launch import SimProcess, start_simulators
from epp.tokenization.qwen import QWEN25_MODEL

pytestmark = pytest.mark.e2e

CONFIG_DIR = Path(__file__).resolve().parents[1] / "config"
ROLE = "llm-d.ai/role"
TEXT = "Describe the picture and compare it with the long catalogue description that follows. " * 12


@dataclass
class Sims:
    workdir: Path
    encode: SimProcess
    prefill: list[SimProcess]
    decode: list[SimProcess]


@dataclass
class EPD:
    sims: Sims
    connector: str
    sidecars: list[SidecarProcess]
    stack: Stack


def _get(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=5) as r:
        text: str = r.read().decode()
    return text


def metric(sim: SimProcess, name: str, labels: dict[str, str] | None = None) -> float:
    return metric_value(_get(sim.url + "/metrics"), name, labels, 0.0)


def items(sims: list[SimProcess], source: str) -> float:
    return sum(metric(s, "sim:encoder_items_total", {"source": source}) for s in sims)


@pytest.fixture(scope="module")
def sims(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sims]:
    workdir = tmp_path_factory.mktemp("epd")
    roles = ["encode", "prefill", "prefill", "decode", "decode"]
    base = ["--model", QWEN25_MODEL, "--block-size", "16", "--encode-time-per-item", "0.2",
            "--ec-shared-storage-path", str(workdir / "ec-cache")]  # fmt: skip
    with start_simulators(
        5, base_args=base, per_sim_args=lambda i: ["--role", roles[i]], events=False, timeout=180
    ) as started:
        yield Sims(workdir, started[0], started[1:3], started[3:])


def config(sims: Sims, sidecars: list[SidecarProcess]) -> str:
    lines = [(CONFIG_DIR / "llm-d-epd.yaml").read_text(), "endpoints:"]
    lines.append(
        f"  - {{name: encode-0, address: 127.0.0.1, port: {sims.encode.http_port}, labels: {{{ROLE}: encode}}}}"
    )
    for i, s in enumerate(sims.prefill):
        lines.append(f"  - {{name: prefill-{i}, address: 127.0.0.1, port: {s.http_port}, labels: {{{ROLE}: prefill}}}}")
    for i, c in enumerate(sidecars):
        lines.append(f"  - {{name: decode-{i}, address: 127.0.0.1, port: {c.port}, labels: {{{ROLE}: decode}}}}")
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module", params=["ec-nixl", "ec-example"])
def epd(request: pytest.FixtureRequest, sims: Sims) -> Iterator[EPD]:
    connector: str = request.param
    sidecars = [
        start_sidecar(sims.workdir, d.http_port, "--kv-connector", "nixlv2", "--ec-connector", connector,
                      "--enable-ssrf-protection", "--allowed-prefillers=127.0.0.1", "--prefill-timeout", "5s")
        for d in sims.decode
    ]  # fmt: skip
    try:
        stack = start_stack(sims.workdir, backends=[], config=config(sims, sidecars))
        try:
            yield EPD(sims, connector, sidecars, stack)
        finally:
            stack.close()
    finally:
        for c in sidecars:
            c.stop()


def image_chat(url: str, text: str = TEXT) -> dict[str, Any]:
    return {
        "model": QWEN25_MODEL,
        "max_tokens": 3,
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": url}}],
            }
        ],
    }


def sidecar_metric(epd: EPD, name: str, labels: dict[str, str] | None = None) -> float:
    return sum(metric_value(c.metrics_text(), name, labels, 0.0) for c in epd.sidecars)


def test_image_request_goes_encode_then_prefill_then_decode(epd: EPD) -> None:
    s = epd.sims
    before = {
        "computed": metric(s.encode, "sim:encoder_items_total", {"source": "computed"}),
        "prefill_loaded": items(s.prefill, "transferred") + items(s.prefill, "shared_storage"),
        "prefill_computed": items(s.prefill, "computed") + items(s.decode, "computed"),
        "remote_decode": sum(metric(p, "sim:remote_decode_requests_total") for p in s.prefill),
        "sidecar_items": sidecar_metric(epd, "pd_sidecar_encoder_items_total"),
    }
    url = f"https://example.com/{epd.connector}/{uuid.uuid4().hex}.png"  # a fresh image: nobody has it cached
    r = post_json(epd.stack.url + "/v1/chat/completions", image_chat(url, f"{uuid.uuid4().hex} {TEXT}"))
    assert r.status == 200, r.body
    assert int(r.headers["x-inference-port"]) in {d.http_port for d in s.decode}
    assert r.json()["usage"]["completion_tokens"] == 3
    # The encode pod encoded the image once; the prefill pod loaded it (ec_transfer_params with ec-nixl, the
    # shared storage with ec-example) and prefilled for the decode pod; nobody else encoded it.
    assert metric(s.encode, "sim:encoder_items_total", {"source": "computed"}) == before["computed"] + 1
    source = "transferred" if epd.connector == "ec-nixl" else "shared_storage"
    assert items(s.prefill, source) >= 1
    assert items(s.prefill, "transferred") + items(s.prefill, "shared_storage") == before["prefill_loaded"] + 1
    assert items(s.prefill, "computed") + items(s.decode, "computed") == before["prefill_computed"]
    assert sum(metric(p, "sim:remote_decode_requests_total") for p in s.prefill) == before["remote_decode"] + 1
    assert sidecar_metric(epd, "pd_sidecar_encoder_items_total") == before["sidecar_items"] + 1
    text = epd.stack.epp.metrics_text()
    assert metric_value(text, "llm_d_epp_disagg_decision_total", {"decision_type": "encode-prefill-decode"}) >= 1


def test_text_only_request_does_not_reach_the_encoder(epd: EPD) -> None:
    s = epd.sims
    pods = [s.encode, *s.prefill, *s.decode]
    before = [metric(p, "sim:encoder_items_total") for p in pods]
    remote = sum(metric(p, "sim:remote_decode_requests_total") for p in s.prefill)
    body = {"model": QWEN25_MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": f"{time.time()} {TEXT}"}]}
    r = post_json(epd.stack.url + "/v1/chat/completions", body)
    assert r.status == 200, r.body
    assert [metric(p, "sim:encoder_items_total") for p in pods] == before  # no item anywhere
    assert sum(metric(p, "sim:remote_decode_requests_total") for p in s.prefill) == remote + 1  # still P/D


def test_encoder_faults_at_the_sidecar(epd: EPD) -> None:
    """Direct to a sidecar (as if the EPP had sent these headers): a dead encoder is a 502 with the cause (llm-d's
    status), a malformed encoder list a 400, an encoder outside the allowlist is dropped (the request is served
    without the encoder stage); never a hang."""
    c = epd.sidecars[0]
    body = image_chat(f"https://example.com/fault/{uuid.uuid4().hex}.png")
    (dead,) = free_ports(1)
    t0 = time.monotonic()
    r = post_json(c.url + "/v1/chat/completions", body, headers={"x-encoder-hosts-ports": f"127.0.0.1:{dead}"})
    assert r.status == 502 and b"encoder" in r.body and time.monotonic() - t0 < 5
    assert r.json()["error"]["code"] == 502
    assert "encoder stage failed" in c.log_text()
    r = post_json(c.url + "/v1/chat/completions", body, headers={"x-encoder-hosts-ports": "127.0.0.1:1,nope"})
    assert r.status == 400 and b"malformed x-encoder-hosts-ports" in r.body
    before = metric(epd.sims.encode, "sim:encoder_items_total", {"source": "computed"})
    r = post_json(c.url + "/v1/chat/completions", body, headers={"x-encoder-hosts-ports": "10.1.2.3:8000"})
    assert r.status == 200  # the only encoder was refused: the decode pod encodes locally
    assert "encoder target 10.1.2.3:8000 not in the allowlist" in c.log_text()
    assert metric(epd.sims.encode, "sim:encoder_items_total", {"source": "computed"}) == before
