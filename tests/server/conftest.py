"""The `epp` fixture: an EPP served over gRPC on loopback, two endpoints, a recording round-robin director."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from prometheus_client import CollectorRegistry

from e2e.harness.directors import RoundRobinDirector
from epp.config import parse_config
from epp.datalayer.datastore import Datastore
from epp.discovery.static import StaticEndpointSource
from epp.framework.types import Endpoint
from epp.server.metrics import RequestMetrics
from epp.server.runner import EppServer, ServeOptions
from epp.wiring.runtime import Runtime
from tests.server.support import Harness, RecordingDirector


@pytest.fixture
async def epp() -> AsyncIterator[Harness]:
    ds = Datastore()
    eps = [Endpoint(name=f"ep{i}", address="10.0.0.1", port=8000 + i) for i in range(2)]
    director = RecordingDirector(RoundRobinDirector(ds))
    config = parse_config("modelRewrites: {alias: real}\n")
    runtime = Runtime(config=config, datastore=ds, director=director, sources=[StaticEndpointSource(eps)])
    registry = CollectorRegistry()
    opts = ServeOptions(bind_address="127.0.0.1", grpc_port=0, grpc_health_port=0, metrics_port=0)
    server = EppServer(runtime, opts, registry=registry, metrics=RequestMetrics(registry))
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.ports['grpc']}")
    for _ in range(100):
        if ds.synced:
            break
        await asyncio.sleep(0.01)
    yield Harness(server, director, channel, pb_grpc.ExternalProcessorStub(channel), registry)
    await channel.close()
    await server.stop()
