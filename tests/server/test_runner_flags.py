"""Serve flags that change the ext_proc server: --enable-grpc-stream-metrics (llm-d-router's metric names),
--disable-endpoint-subset-filter, --grpc-max-recv-msg-size, --health-checking."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry

from e2e.harness.directors import RoundRobinDirector
from epp.config import parse_config
from epp.datalayer.datastore import Datastore
from epp.discovery.static import StaticEndpointSource
from epp.framework.types import Endpoint
from epp.server.metrics import RequestMetrics
from epp.server.runner import EppServer, ServeOptions
from epp.wiring.runtime import Runtime
from tests.server.support import DEST, body_msg, exchange, headers_msg, set_headers


@asynccontextmanager
async def server(**kw: object) -> AsyncIterator[tuple[EppServer, pb_grpc.ExternalProcessorStub, CollectorRegistry]]:
    ds = Datastore()
    eps = [Endpoint(name=f"ep{i}", address="10.0.0.1", port=8000 + i) for i in range(2)]
    runtime = Runtime(
        config=parse_config(""), datastore=ds, director=RoundRobinDirector(ds), sources=[StaticEndpointSource(eps)]
    )
    registry = CollectorRegistry()
    opts = ServeOptions(bind_address="127.0.0.1", grpc_port=0, grpc_health_port=0, metrics_port=0, **kw)  # type: ignore[arg-type]
    srv = EppServer(runtime, opts, registry=registry, metrics=RequestMetrics(registry))
    await srv.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{srv.ports['grpc']}")
    while not ds.synced:
        await asyncio.sleep(0.01)
    try:
        yield srv, pb_grpc.ExternalProcessorStub(channel), registry
    finally:
        await channel.close()
        await srv.stop()


def sample(registry: CollectorRegistry, name: str, labels: dict[str, str] | None = None) -> float:
    value = registry.get_sample_value(name, labels or {})
    return 0.0 if value is None else value


async def test_grpc_stream_metrics() -> None:
    async with server(enable_grpc_stream_metrics=True) as (_, stub, registry):
        call = stub.Process()
        await exchange(call, [headers_msg("/v1/models", "GET", eos=True)], 1)
        assert sample(registry, "llm_d_epp_extproc_streams_inflight") == 1
        await call.done_writing()
        assert await call.read() is grpc.aio.EOF
        await asyncio.sleep(0.05)
        assert sample(registry, "llm_d_epp_extproc_streams_inflight") == 0
        assert sample(registry, "llm_d_epp_extproc_streams_total", {"code": "OK"}) == 1
        assert sample(registry, "llm_d_epp_extproc_stream_duration_seconds_count") == 1
        # A second stream while the first is done: the counter and histogram add up.
        call = stub.Process()
        await exchange(call, [headers_msg("/v1/models", "GET", eos=True)], 1)
        await call.done_writing()
        assert await call.read() is grpc.aio.EOF
        await asyncio.sleep(0.05)
        assert sample(registry, "llm_d_epp_extproc_streams_total", {"code": "OK"}) == 2
        assert sample(registry, "llm_d_epp_extproc_stream_duration_seconds_count") == 2
        assert sample(registry, "llm_d_epp_extproc_streams_inflight") == 0
    async with server() as (_, stub, registry):
        call = stub.Process()
        await exchange(call, [headers_msg("/v1/models", "GET", eos=True)], 1)
        call.cancel()
        assert registry.get_sample_value("llm_d_epp_extproc_streams_inflight") is None  # off by default


@pytest.mark.parametrize("honor", [True, False])
async def test_subset_filter_flag(honor: bool) -> None:
    async with server(honor_subset_hint=honor) as (_, stub, _r):
        picked = set()
        for _ in range(4):
            call = stub.Process()
            msgs = [headers_msg(subset=["10.0.0.1:8001"]), body_msg(b'{"model":"m","prompt":"x"}', True)]
            first, _ = await exchange(call, msgs, 2)
            picked.add(set_headers(first)[DEST])
            call.cancel()
        assert picked == ({"10.0.0.1:8001"} if honor else {"10.0.0.1:8000", "10.0.0.1:8001"})


async def test_max_recv_message_size() -> None:
    async with server(grpc_max_recv_bytes=64 * 1024) as (_, stub, _r):
        call = stub.Process()
        await call.write(headers_msg())
        await call.write(body_msg(b"x" * (128 * 1024), True))
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await asyncio.wait_for(call.read(), 5)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


@pytest.mark.parametrize("enabled", [True, False])
async def test_health_checking_on_the_ext_proc_port(enabled: bool) -> None:
    async with server(health_checking=enabled) as (srv, _, _r):
        ch = grpc.aio.insecure_channel(f"127.0.0.1:{srv.ports['grpc']}")
        stub = health_pb2_grpc.HealthStub(ch)
        req = health_pb2.HealthCheckRequest(service="envoy.service.ext_proc.v3.ExternalProcessor")
        try:
            if enabled:
                for _ in range(100):
                    if (await stub.Check(req)).status == health_pb2.HealthCheckResponse.SERVING:
                        break
                    await asyncio.sleep(0.02)
                assert (await stub.Check(req)).status == health_pb2.HealthCheckResponse.SERVING
            else:
                with pytest.raises(grpc.aio.AioRpcError) as e:
                    await stub.Check(req)
                assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
        finally:
            await ch.close()


@pytest.mark.parametrize("emit", [True, False])
async def test_emit_endpoint_scores(emit: bool) -> None:
    """llm-d-router's --emit-endpoint-scores: every scored candidate's weighted total in envoy.lb metadata."""
    from epp.wiring import build_runtime

    config = parse_config("endpoints: [{address: 10.0.0.1, port: 8000}, {address: 10.0.0.2, port: 8000}]\n")
    runtime = build_runtime(config)
    registry = CollectorRegistry()
    opts = ServeOptions(bind_address="127.0.0.1", grpc_port=0, grpc_health_port=0, metrics_port=0,
                        emit_endpoint_scores=emit)  # fmt: skip
    srv = EppServer(runtime, opts, registry=registry, metrics=RequestMetrics(registry))
    await srv.start()
    try:
        while not runtime.datastore.synced:
            await asyncio.sleep(0.01)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{srv.ports['grpc']}") as ch:
            call = pb_grpc.ExternalProcessorStub(ch).Process()
            first, _ = await exchange(call, [headers_msg(), body_msg(b'{"model":"m","prompt":"x"}', True)], 2)
            call.cancel()
        lb = first.dynamic_metadata.fields["envoy.lb"].struct_value.fields
        assert lb[DEST].string_value in ("10.0.0.1:8000", "10.0.0.2:8000")
        if emit:
            scores = {
                k: v.number_value for k, v in lb["x-gateway-destination-endpoint-scores"].struct_value.fields.items()
            }
            assert set(scores) == {"10.0.0.1:8000", "10.0.0.2:8000"}
            assert all(isinstance(v, float) and v >= 0 for v in scores.values())
            assert scores[lb[DEST].string_value] == max(scores.values())  # the pick has the best score
        else:
            assert "x-gateway-destination-endpoint-scores" not in lb
    finally:
        await srv.stop()
