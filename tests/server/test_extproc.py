"""The ext_proc servicer driven directly over gRPC (grpc.aio client, no Envoy): message order, errors, lifecycle."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry

from e2e.harness.directors import RoundRobinDirector
from epp.config import parse_config
from epp.datalayer.datastore import Datastore
from epp.discovery.static import StaticEndpointSource
from epp.framework.types import Endpoint, InferenceRequest, Usage
from epp.requestcontrol.types import RoutingDecision
from epp.server.extproc import RequestStream, ServerState
from epp.server.metrics import RequestMetrics
from epp.server.runner import EppServer, ServeOptions
from epp.wiring.runtime import Runtime
from tests.server.support import (
    DEST,
    Harness,
    RecordingDirector,
    bare_server,
    body_msg,
    exchange,
    headers_msg,
    real_server,
    resp_body_msg,
    resp_headers_msg,
    set_headers,
)


async def test_client_cancel_still_completes_once(epp: Harness) -> None:
    call = epp.stub.Process()
    await exchange(call, [headers_msg(), body_msg(b'{"model":"m","prompt":"x"}', True), resp_headers_msg()], 3)
    call.cancel()
    for _ in range(100):
        if epp.director.completed:
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    assert epp.director.completed == [("rid-1", None)]
    assert epp.registry.get_sample_value("inference_objective_running_requests", {"model_name": "m"}) == 0


async def test_health_services(epp: Harness) -> None:
    for port in (epp.server.ports["health"], epp.server.ports["grpc"]):
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            for svc in ("liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor", "inference-extension"):
                r = await stub.Check(health_pb2.HealthCheckRequest(service=svc))
                assert r.status == health_pb2.HealthCheckResponse.SERVING, svc


async def test_readiness_waits_for_sync() -> None:
    ds = Datastore()
    server = bare_server(ds)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.ports['health']}") as ch:
            stub = health_pb2_grpc.HealthStub(ch)

            async def status(svc: str) -> int:
                return int((await stub.Check(health_pb2.HealthCheckRequest(service=svc))).status)

            assert await status("liveness") == health_pb2.HealthCheckResponse.SERVING
            assert await status("readiness") == health_pb2.HealthCheckResponse.NOT_SERVING
            ds.synced = True
            for _ in range(100):
                if await status("readiness") == health_pb2.HealthCheckResponse.SERVING:
                    break
                await asyncio.sleep(0.02)
            assert await status("envoy.service.ext_proc.v3.ExternalProcessor") == health_pb2.HealthCheckResponse.SERVING
    finally:
        await server.stop()


async def test_readiness_waits_for_the_tokenizer_warm_up() -> None:
    """A synced datastore is not enough: the server is ready only once its startup loads (tokenizers) finished,
    so no request is the one that loads a tokenizer."""
    ds = Datastore()
    ds.synced = True
    loaded = asyncio.Event()

    async def warm() -> None:
        await loaded.wait()

    runtime = Runtime(
        config=parse_config(""), datastore=ds, director=RoundRobinDirector(ds), sources=[], warmups=[warm]
    )
    registry = CollectorRegistry()
    opts = ServeOptions(bind_address="127.0.0.1", grpc_port=0, grpc_health_port=0, metrics_port=0)
    server = EppServer(runtime, opts, registry=registry, metrics=RequestMetrics(registry))
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.ports['health']}") as ch:
            stub = health_pb2_grpc.HealthStub(ch)

            async def ready() -> bool:
                r = await stub.Check(health_pb2.HealthCheckRequest(service="readiness"))
                return bool(r.status == health_pb2.HealthCheckResponse.SERVING)

            await asyncio.sleep(0.2)  # several readiness polls with the warm-up still running
            assert not await ready()
            loaded.set()
            for _ in range(100):
                if await ready():
                    break
                await asyncio.sleep(0.02)
            assert await ready()
    finally:
        await server.stop()


async def test_graceful_stop_drains_in_flight_stream(epp: Harness) -> None:
    call = epp.stub.Process()
    await exchange(call, [headers_msg(), body_msg(b'{"model":"m","prompt":"x"}', True)], 2)
    stopping = asyncio.create_task(epp.server.stop())
    await asyncio.sleep(0.2)
    assert not stopping.done()  # waits for the open stream
    assert not epp.server.health.ready
    rs = await exchange(call, [resp_headers_msg(), resp_body_msg(b'{"usage":{"prompt_tokens":1}}', True)], 2)
    assert rs[1].response_body.response.body_mutation.streamed_response.end_of_stream
    await call.done_writing()
    assert await call.read() is grpc.aio.EOF
    await asyncio.wait_for(stopping, 5)
    assert epp.director.completed[0][1] == Usage(prompt_tokens=1, total_tokens=1)


async def test_request_trailers_end_the_body(epp: Harness) -> None:
    call = epp.stub.Process()
    trailers = pb.ProcessingRequest(request_trailers=pb.HttpTrailers())
    rs = await exchange(call, [headers_msg(), body_msg(b'{"model":"m","prompt":"x"}', False), trailers], 3)
    assert set_headers(rs[0])[DEST].startswith("10.0.0.1:")
    sr = rs[1].request_body.response.body_mutation.streamed_response
    assert (sr.body, sr.end_of_stream) == (b'{"model":"m","prompt":"x"}', False)
    assert rs[2].HasField("request_trailers")
    call.cancel()


async def test_port_in_use_is_a_clear_bind_error() -> None:
    import socket

    from epp.server.runner import BindError

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        ds = Datastore()
        server = bare_server(ds, grpc_port=port)
        with pytest.raises(BindError, match=f"grpc port 127.0.0.1:{port}"):
            await server.start()


async def _draining_server(drain: float) -> tuple[EppServer, RecordingDirector]:
    ds = Datastore()
    eps = [Endpoint(name=f"ep{i}", address="10.0.0.1", port=8000 + i) for i in range(2)]
    director = RecordingDirector(RoundRobinDirector(ds))
    runtime = Runtime(config=parse_config(""), datastore=ds, director=director, sources=[StaticEndpointSource(eps)])
    registry = CollectorRegistry()
    opts = ServeOptions(
        bind_address="127.0.0.1", grpc_port=0, grpc_health_port=0, metrics_port=0, drain_timeout=drain
    )  # fmt: skip
    server = EppServer(runtime, opts, registry=registry, metrics=RequestMetrics(registry))
    await server.start()
    for _ in range(100):
        if ds.synced and server.health.ready:
            break
        await asyncio.sleep(0.02)
    return server, director


async def _health(server: EppServer) -> dict[str, int]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.ports['health']}") as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        names = ("liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor")
        return {n: int((await stub.Check(health_pb2.HealthCheckRequest(service=n))).status) for n in names}


async def _whole_request(stub: pb_grpc.ExternalProcessorStub) -> str:
    call = stub.Process()
    out = await exchange(call, [headers_msg(), body_msg(b'{"model":"m","prompt":"x"}', True)], 2)
    await exchange(call, [resp_headers_msg(), resp_body_msg(b'{"ok":1}', True)], 2)
    await call.done_writing()
    assert await call.read() is grpc.aio.EOF
    return set_headers(out[0])[DEST]


async def test_drain_window_serves_new_streams_then_waits_for_in_flight_ones() -> None:
    """llm-d-router's --drain-timeout: at SIGTERM readiness goes NOT_SERVING (liveness stays SERVING) while ext_proc
    keeps serving, new streams included, for the whole window; then new streams are refused and the in-flight ones
    finish in their own time (past the window); then stop() returns."""
    serving, not_serving = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
    server, director = await _draining_server(1.0)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.ports['grpc']}")
    stub = pb_grpc.ExternalProcessorStub(channel)
    try:
        in_flight = stub.Process()
        await exchange(in_flight, [headers_msg(), body_msg(b'{"model":"m","prompt":"long"}', True)], 2)
        t0 = asyncio.get_running_loop().time()
        stopping = asyncio.create_task(server.stop())
        await asyncio.sleep(0.1)
        h = await _health(server)
        assert h["liveness"] == serving and h["readiness"] == not_serving
        assert h["envoy.service.ext_proc.v3.ExternalProcessor"] == not_serving
        assert (await _whole_request(stub)).startswith("10.0.0.1:")  # a new stream inside the window is served
        await asyncio.sleep(1.2)  # the window is over: new streams are refused, the open one still runs
        with pytest.raises(grpc.aio.AioRpcError) as ei:
            await _whole_request(stub)
        assert ei.value.code() == grpc.StatusCode.UNAVAILABLE
        assert not stopping.done()
        rs = await exchange(in_flight, [resp_headers_msg(), resp_body_msg(b'{"usage":{"prompt_tokens":3}}', True)], 2)
        assert rs[1].response_body.response.body_mutation.streamed_response.end_of_stream
        await in_flight.done_writing()
        assert await in_flight.read() is grpc.aio.EOF
        await asyncio.wait_for(stopping, 5)
        assert asyncio.get_running_loop().time() - t0 >= 1.0
        assert [u for _, u in director.completed][-1] == Usage(prompt_tokens=3, total_tokens=3)
        assert len(director.completed) == 2
    finally:
        await channel.close()
        if not server._stopping:
            await server.stop()


async def test_a_second_signal_ends_the_window_and_aborts_in_flight_streams() -> None:
    server, _ = await _draining_server(30.0)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.ports['grpc']}")
    try:
        call = pb_grpc.ExternalProcessorStub(channel).Process()
        await exchange(call, [headers_msg(), body_msg(b'{"model":"m","prompt":"x"}', True)], 2)
        stopping = asyncio.create_task(server.stop())
        await asyncio.sleep(0.2)
        assert not stopping.done()  # inside the 30 s window
        server.force_stop()
        await asyncio.wait_for(stopping, 5)
        with pytest.raises(grpc.aio.AioRpcError):
            await call.read()
    finally:
        await channel.close()


class _Context:
    """What ExtProcServicer.Process uses of a grpc.aio context: read() from a list, write() into one."""

    def __init__(self, messages: list[pb.ProcessingRequest]) -> None:
        self.messages = list(messages)
        self.written: list[pb.ProcessingResponse] = []

    async def read(self) -> Any:
        return self.messages.pop(0) if self.messages else grpc.aio.EOF

    async def write(self, resp: pb.ProcessingResponse) -> None:
        self.written.append(resp)


@pytest.mark.parametrize("before", [False, True])
async def test_the_last_answer_is_written_before_the_request_completes(before: bool) -> None:
    """Usage, metrics and the ResponseComplete hooks run after the last body answer is written, off the client's
    path, unless a hook's output goes out with that answer (request-attribute-reporter)."""
    from epp.server.extproc import ExtProcServicer

    ds = Datastore()
    ds.replace_all([Endpoint("a", "10.0.0.1", 8000)])
    director = RecordingDirector(RoundRobinDirector(ds), completes_before_last_answer=before)
    ctx = _Context(
        [
            headers_msg(),
            body_msg(b'{"model": "m", "prompt": "x"}', True),
            resp_headers_msg(),
            resp_body_msg(b'{"id":"1","usage":{"prompt_tokens":3,"completion_tokens":2}}', True),
        ]
    )
    seen: list[int] = []
    recorded = director.handle_response_complete

    def complete(request: InferenceRequest, decision: RoutingDecision | None, usage: Usage | None) -> None:
        seen.append(len(ctx.written))
        recorded(request, decision, usage)

    director.handle_response_complete = complete  # type: ignore[method-assign]
    state = ServerState(director, ds, RequestMetrics(CollectorRegistry()))
    await ExtProcServicer(state).Process(None, ctx)  # type: ignore[arg-type]
    assert len(ctx.written) == 4 and ctx.written[3].HasField("response_body")
    assert seen == [3 if before else 4]  # once, before or after the last answer went out
    assert director.completed and director.completed[0][1] is not None  # with the usage read from the body


ACTIVE_CONFIG = """
endpoints: [{address: 10.9.0.1, port: 8000}, {address: 10.9.0.2, port: 8000}]
plugins:
- type: active-request-scorer
schedulingProfiles:
- name: default
  plugins: [{pluginRef: active-request-scorer}]
"""


async def test_the_pick_is_booked_once_its_answer_is_written() -> None:
    """The in-flight booking (a records-only PreRequest hook) is off the answer's path: a stream's own handling
    returns the answer without it, and the servicer makes it once the answer is written, before anything else."""
    from epp.plugins.producers.inflight_load_producer import InFlightLoadProducer
    from epp.requestcontrol.director import SchedulingDirector

    server, channel, stub = await real_server(ACTIVE_CONFIG)
    try:
        director = server.runtime.director
        assert isinstance(director, SchedulingDirector)
        producer = director.pipeline.plugins["inflight-load-producer"]
        assert isinstance(producer, InFlightLoadProducer)

        def booked() -> int:
            return sum(load.requests for load in producer.loads.values())

        body = b'{"model":"m","prompt":"hi"}'
        stream = RequestStream(server.state)
        stream.defer_completion = True  # as the servicer sets it
        assert list(await stream.handle(headers_msg())) == []
        answer = list(await stream.handle(body_msg(body, True)))
        assert set_headers(answer[0])[DEST] and booked() == 0
        stream.written()
        assert booked() == 1
        stream.complete()
        assert booked() == 0

        call = stub.Process()  # through gRPC: booked by the time the client has the answer and the loop turns
        out = await exchange(call, [headers_msg(), body_msg(body, True)], 2)
        assert set_headers(out[0])[DEST]
        for _ in range(100):
            if booked() == 1:
                break
            await asyncio.sleep(0.01)
        assert booked() == 1
        call.cancel()
        for _ in range(100):
            if booked() == 0:
                break
            await asyncio.sleep(0.01)
        assert booked() == 0  # the cancelled stream's completion released it
    finally:
        await channel.close()
        await server.stop()


async def test_the_records_run_after_each_answer_is_written_before_the_next_message() -> None:
    """The servicer runs the held-back records once a message's answers are written (not before, not at the end of
    the stream): the booking is absent while the routing answer is written and present by the next read; with one
    stream's answer still being written, another stream's pick finds it booked."""
    from epp.plugins.producers.inflight_load_producer import InFlightLoadProducer
    from epp.server.extproc import ExtProcServicer

    server, channel, _ = await real_server(ACTIVE_CONFIG)
    try:
        producer = server.runtime.director.pipeline.plugins["inflight-load-producer"]  # type: ignore[attr-defined]
        assert isinstance(producer, InFlightLoadProducer)

        def booked() -> int:
            return sum(load.requests for load in producer.loads.values())

        events: list[tuple[str, int]] = []

        class Watching(_Context):
            async def read(self) -> Any:
                msg = await super().read()
                events.append(("read" if msg is not grpc.aio.EOF else "eof", booked()))
                return msg

            async def write(self, resp: pb.ProcessingResponse) -> None:
                await super().write(resp)
                events.append((resp.WhichOneof("response") or "", booked()))

        body = b'{"model":"m","prompt":"hi"}'
        ctx = Watching([headers_msg(), body_msg(body, True), resp_headers_msg(), resp_body_msg(b'{"ok":1}', True)])
        await ExtProcServicer(server.state).Process(None, ctx)  # type: ignore[arg-type]
        assert events == [
            ("read", 0),  # request headers: held until the body is decided
            ("read", 0),  # the body: decided, the booking held back ...
            ("request_headers", 0),  # ... while the answer is written
            ("request_body", 0),
            ("read", 1),  # booked once the answers were written, before the next message
            ("response_headers", 1),
            ("read", 1),
            ("response_body", 0),  # released by the last chunk's streaming hook
            ("eof", 0),
        ]

        # Two streams: while the first one's answer is being written, the second one's pick sees its booking.
        gate = asyncio.Event()
        seen: list[str] = []

        class Slow(_Context):
            async def write(self, resp: pb.ProcessingResponse) -> None:
                await super().write(resp)
                if resp.HasField("request_headers"):
                    seen.append(set_headers(resp)[DEST])
                    await gate.wait()

        one = Slow([headers_msg(), body_msg(body, True)])
        first = asyncio.ensure_future(ExtProcServicer(server.state).Process(None, one))  # type: ignore[arg-type]
        while not seen:
            await asyncio.sleep(0.001)
        assert booked() == 0  # the first answer is still being written: its records wait
        two = _Context([headers_msg(), body_msg(body, True)])
        await ExtProcServicer(server.state).Process(None, two)  # type: ignore[arg-type]
        assert set_headers(two.written[0])[DEST] != seen[0]  # the first pick was booked before the second one
        gate.set()
        await first
    finally:
        await channel.close()
        await server.stop()
