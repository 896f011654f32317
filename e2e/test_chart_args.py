"""`epp serve` starts with the container args our chart renders from the anchors' own values files (GIE v1.5's
inferencepool chart, llm-d-router v0.10's gateway chart, an llm-d guide), against the fake API server: it reaches
readiness, serves TLS on ext_proc, and guards /metrics with Kubernetes auth, as the anchors' EPP would."""

from __future__ import annotations

import asyncio
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from e2e.harness.ports import free_ports
from e2e.harness.procs import EppPorts, EppProcess
from tests.deploy.test_anchor_values import CASES, config_file, container_args, layered
from tests.deploy.test_helm_chart import by_kind, render
from tests.fakekube.server import INFERENCE_POOLS, PODS, FakeKube, inference_pool, pod
from tests.fakekube.testing import write_kubeconfig

pytestmark = pytest.mark.e2e


def status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return e.code


STARTED = [
    "gie-inferencepool",
    "llm-d-router-gateway",
    "guide-flow-control",
    # standalone (--endpoint-selector, no InferencePool), with the proxy/sidecar beside the EPP
    "router-sa-basic",
    "gie-standalone-no-pool",
    # the anchors' latency-predictor profile in the default config (GIE's variant), GKE managed Prometheus
    "gie-site-latency-predictor",
    # perf configs: random picker + passthrough parser; precise prefix with the tokenizer sidecar's /render backend
    "perf-random-passthrough",
    "perf-precise-prefix",
    # llm-d guides: P/D with context-length filtering (standalone chart), precise prefix-cache routing (gateway
    # chart on GKE), GIE-layout predicted latency
    "guide-sa:llm-d__guides__context-length-aware-pd__router.values.yaml",
    "guide-gw:llm-d-fork__guides__precise-prefix-cache-routing__router__precise-prefix-cache-routing.values.yaml",
    "guide-gie:llm-d__guides__predicted-latency-based-scheduling__scheduler__predicted-latency.values.yaml",
]


@pytest.mark.parametrize("case", STARTED, ids=[c.split("__guides__")[-1] for c in STARTED])
async def test_rendered_container_args_start_epp_serve(case: str, tmp_path: Path) -> None:
    files, extra = CASES[case]
    docs = render(layered(*files, extra=extra), name="qwen-pool", namespace="llm")
    args = container_args(docs)
    name, text = config_file(docs)
    (tmp_path / name).write_text(text)
    pools = by_kind(docs, "InferencePool")
    labels = pools[0]["spec"]["selector"]["matchLabels"] if pools else {"app": "vllm-qwen"}
    kube = FakeKube()
    await kube.start()
    try:
        if pools:
            obj: dict[str, Any] = inference_pool("qwen-pool", labels, [8000])
            obj["metadata"]["namespace"] = "llm"
            kube.create(INFERENCE_POOLS, obj, "llm")
        else:
            assert any(a.startswith("--endpoint-selector=app=vllm-qwen") for a in args)
            args.append("--pool-namespace=llm")  # in the pod: $NAMESPACE
        kube.create(PODS, pod("m1", "127.0.0.9", labels), "llm")
        # The rendered args as they are; the test only moves the config file (mounted at /config in the pod), the
        # ports (9002/9003/9090 may be taken here) and the API server's address.
        argv = [a.replace("/config/", f"{tmp_path}/") for a in args[1:]]
        ports = EppPorts(*free_ports(3))
        argv += [f"--grpc-port={ports.grpc}", f"--grpc-health-port={ports.health}", f"--metrics-port={ports.metrics}",
                 f"--kubeconfig={write_kubeconfig(kube, tmp_path)}", "--bind-address=127.0.0.1"]  # fmt: skip
        p = EppProcess(tmp_path / name, tmp_path, ports=ports, extra_args=argv, kit_defaults=False)
        try:
            await asyncio.to_thread(p.wait_ready, 60)
            # TLS on ext_proc (the anchors' default), metrics behind Kubernetes auth (the charts' default).
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            _reader, writer = await asyncio.open_connection("127.0.0.1", ports.grpc, ssl=ctx)
            writer.close()
            assert await asyncio.to_thread(status, f"http://127.0.0.1:{ports.metrics}/metrics") == 401
            log = p.log_text()
            assert '"level": "info"' in log or '"level":"info"' in log  # --zap-encoder=json from the chart
        finally:
            p.stop()
    finally:
        await kube.stop()
