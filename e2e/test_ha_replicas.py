"""Active-active HA: two `python -m epp serve` replicas with the same config, discovering the same pool from the
(fake) Kubernetes API and scraping the same simulators, pick the same endpoint for every request and follow the
same discovery changes.

State: three simulator ranks of one pod (targetPorts = the three ports) with different, stable load: rank 0 idle,
rank 1 one running + two waiting requests, rank 2 one running. Every request is asked with every subset hint, so
the expected pick differs per request (and is checked), and both replicas must agree on all of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import grpc
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from e2e.harness.procs import EppProcess
from e2e.sim.launch import SimProcess, start_simulators
from tests.fakekube.server import INFERENCE_POOLS, PODS, FakeKube, inference_pool, pod
from tests.fakekube.testing import write_kubeconfig

pytestmark = pytest.mark.e2e

DEST = "x-gateway-destination-endpoint"
MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
CONFIG = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
refreshMetricsInterval: 50ms
plugins:
- type: queue-scorer
- type: running-requests-size-scorer
- type: max-score-picker
- type: metrics-data-source
- type: core-metrics-extractor
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: running-requests-size-scorer
    weight: 1
  - pluginRef: max-score-picker
dataLayer:
  sources:
  - pluginRef: metrics-data-source
    extractors:
    - pluginRef: core-metrics-extractor
"""


def headers_msg(subset: list[str] | None) -> pb.ProcessingRequest:
    hs = {":path": "/v1/completions", ":method": "POST", ":authority": "gw", "content-type": "application/json"}
    msg = pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(
            headers=base_pb2.HeaderMap(
                headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in hs.items()]
            )
        ),
        protocol_config=pb.ProtocolConfiguration(
            request_body_mode=processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED,
            response_body_mode=processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED,
        ),
    )
    if subset is not None:
        msg.metadata_context.filter_metadata["envoy.lb.subset_hint"].update(
            {"x-gateway-destination-endpoint-subset": subset}
        )
    return msg


async def pick(stub: pb_grpc.ExternalProcessorStub, prompt: str, subset: list[str] | None) -> str:
    """One request through the EPP's ext_proc stream; returns the destination it set."""
    call = stub.Process()
    try:
        body = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 4}).encode()
        await call.write(headers_msg(subset))
        await call.write(pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True)))
        first = await asyncio.wait_for(call.read(), 10)
        assert first is not grpc.aio.EOF and first.HasField("request_headers"), first
        sets = first.request_headers.response.header_mutation.set_headers
        return next(h.header.raw_value.decode() for h in sets if h.header.key == DEST)
    finally:
        call.cancel()


async def hold(session: aiohttp.ClientSession, sim: SimProcess) -> None:
    """A long streaming request that keeps a simulator busy (running or waiting) until cancelled."""
    body = {"model": MODEL, "prompt": "keep busy", "max_tokens": 3000, "stream": True}
    async with session.post(sim.url + "/v1/completions", json=body) as resp:
        async for _ in resp.content:
            pass


async def sim_load(session: aiohttp.ClientSession, sim: SimProcess) -> tuple[int, int]:
    async with session.get(sim.url + "/metrics") as r:
        text = await r.text()
    vals = {}
    for line in text.splitlines():
        for name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
            if line.startswith(name + "{") or line.startswith(name + " "):
                vals[name] = int(float(line.rsplit(" ", 1)[1]))
    return vals.get("vllm:num_requests_running", 0), vals.get("vllm:num_requests_waiting", 0)


@contextlib.asynccontextmanager
async def replicas(workdir: Path, kubeconfig: str, n: int) -> AsyncIterator[list[EppProcess]]:
    cfg = workdir / "epp.yaml"
    cfg.write_text(CONFIG)
    args = ["--pool-name", "pool", "--pool-namespace", "default", "--kubeconfig", kubeconfig]
    procs = [EppProcess(cfg, workdir, extra_args=args) for _ in range(n)]
    try:
        # wait_ready blocks; run it off the loop so the in-process fake API server keeps answering.
        await asyncio.gather(*(asyncio.to_thread(p.wait_ready, 60.0) for p in procs))
        yield procs
    finally:
        for p in procs:
            p.stop()


async def test_two_replicas_pick_identically(tmp_path: Path) -> None:
    kube = FakeKube()
    await kube.start()
    tasks: list[asyncio.Task[None]] = []
    try:
        with start_simulators(
            3, base_args=["--max-num-seqs", "1", "--inter-token-latency", "0.05"], events=False
        ) as sims:
            ports = [s.http_port for s in sims]
            hostports = [s.hostport for s in sims]
            kube.create(INFERENCE_POOLS, inference_pool("pool", {"app": "sim"}, ports))
            kube.create(PODS, pod("sims", "127.0.0.1", {"app": "sim"}))
            async with aiohttp.ClientSession() as session:
                for sim, n in zip(sims, (0, 3, 1), strict=True):
                    tasks += [asyncio.create_task(hold(session, sim)) for _ in range(n)]
                for _ in range(400):
                    if [await sim_load(session, s) for s in sims] == [(0, 0), (1, 2), (1, 0)]:
                        break
                    await asyncio.sleep(0.05)
                else:
                    raise AssertionError("simulators never reached the intended load")
                async with replicas(tmp_path, write_kubeconfig(kube, tmp_path), 2) as (a, b):
                    await asyncio.sleep(0.5)  # ten scrape intervals
                    channels = [grpc.aio.insecure_channel(f"127.0.0.1:{p.ports.grpc}") for p in (a, b)]
                    stubs = [pb_grpc.ExternalProcessorStub(c) for c in channels]
                    try:
                        subsets: list[list[str] | None] = [None]
                        for k in (1, 2, 3):
                            subsets += [list(c) for c in itertools.combinations(hostports, k)]
                        for i, subset in enumerate(subsets * 3):
                            prompt = f"request {i}: tell me about ranks"
                            got = [await pick(s, prompt, subset) for s in stubs]
                            assert got[0] == got[1], (subset, got)
                            # The least loaded rank in the allowed set: 0 idle < 2 (one running) < 1 (busy).
                            allowed = subset or hostports
                            expect = next(h for h in (hostports[0], hostports[2], hostports[1]) if h in allowed)
                            assert got[0] == expect, (subset, got)
                        # A discovery change reaches both replicas: rank 0 leaves via the active-ports annotation.
                        annotation = {"inference.networking.k8s.io/active-ports": f"{ports[1]},{ports[2]}"}
                        kube.patch(PODS, "default", "sims", {"metadata": {"annotations": annotation}})
                        for _ in range(200):
                            got = [await pick(s, "after the change", None) for s in stubs]
                            if got == [hostports[2], hostports[2]]:
                                break
                            await asyncio.sleep(0.05)
                        assert got == [hostports[2], hostports[2]]
                        for subset in ([hostports[0], hostports[1]], [hostports[1]]):
                            got = [await pick(s, "narrowed", subset) for s in stubs]
                            assert got[0] == got[1], (subset, got)
                    finally:
                        for c in channels:
                            await c.close()
                    # Both replicas really watched the pool through the API (one watch each on pods and pools).
                    pod_watchers = {r.query.get("labelSelector") for r in kube.watch_requests("pods")}
                    assert pod_watchers == {"app=sim"} and len(kube.list_requests("pods")) >= 2
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, aiohttp.ClientError):
                await t
        await kube.stop()
