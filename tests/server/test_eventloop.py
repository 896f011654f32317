"""--event-loop: which loop `epp serve` runs on, and that the EPP's server works on it."""

from __future__ import annotations

import asyncio
import builtins
import sys
from typing import Any

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from epp.server.eventloop import loop_factory, run, set_switch_interval
from epp.server.options import FlagError, parse_options


def test_auto_prefers_uvloop_and_asyncio_is_the_standard_loop() -> None:
    import uvloop

    assert loop_factory("auto") == ("uvloop", uvloop.new_event_loop)
    assert loop_factory("uvloop") == ("uvloop", uvloop.new_event_loop)
    assert loop_factory("asyncio") == ("asyncio", None)


def test_without_uvloop_auto_falls_back_and_uvloop_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_uvloop(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "uvloop":
            raise ImportError("No module named 'uvloop'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_uvloop)
    assert loop_factory("auto") == ("asyncio", None)
    with pytest.raises(RuntimeError, match="uvloop is not installed"):
        loop_factory("uvloop")


def test_event_loop_flag() -> None:
    assert parse_options([]).event_loop == "auto"  # uvloop, which the package installs
    assert parse_options(["--event-loop", "asyncio"]).event_loop == "asyncio"
    assert parse_options(["--event-loop", "uvloop"]).event_loop == "uvloop"
    with pytest.raises(FlagError, match='invalid argument "tokio" for "--event-loop"'):
        parse_options(["--event-loop", "tokio"])


def test_gil_switch_interval_flag() -> None:
    assert parse_options([]).gil_switch_interval == 0.0
    assert parse_options(["--gil-switch-interval", "500us"]).gil_switch_interval == 0.0005
    with pytest.raises(FlagError, match="--gil-switch-interval must not be negative"):
        parse_options(["--gil-switch-interval", "-1ms"])
    saved = sys.getswitchinterval()
    try:
        assert set_switch_interval(0.0) == saved  # 0: Python's, untouched
        assert set_switch_interval(0.0005) == pytest.approx(0.0005)
        assert sys.getswitchinterval() == pytest.approx(0.0005)
    finally:
        sys.setswitchinterval(saved)


def test_the_grpc_aio_server_serves_on_uvloop() -> None:
    """grpc.aio on uvloop: an ext_proc stream answered end to end (the EPP's transport)."""
    from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

    class Echo(pb_grpc.ExternalProcessorServicer):
        async def Process(self, request_iterator: object, context: grpc.aio.ServicerContext) -> None:
            while (msg := await context.read()) is not grpc.aio.EOF:
                assert msg.WhichOneof("request") == "request_headers"
                await context.write(pb.ProcessingResponse(request_headers=pb.HeadersResponse()))

    async def main() -> tuple[str, int]:
        server = grpc.aio.server()
        pb_grpc.add_ExternalProcessorServicer_to_server(Echo(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                call = pb_grpc.ExternalProcessorStub(ch).Process()
                answers = 0
                for _ in range(3):
                    await call.write(pb.ProcessingRequest(request_headers=pb.HttpHeaders()))
                    resp = await call.read()
                    answers += resp.WhichOneof("response") == "request_headers"
                await call.done_writing()
        finally:
            await server.stop(0)
        return type(asyncio.get_running_loop()).__module__, answers

    module, answers = run(main(), loop_factory("uvloop")[1])
    assert module.startswith("uvloop")
    assert answers == 3


def test_the_metrics_scrapers_get_works_on_uvloop() -> None:
    """KeepAliveGet (an asyncio.Protocol) on uvloop: a kept-alive GET, then a refused reconnect once the server is
    gone (uvloop's transport is not an asyncio.Transport subclass; a type check on it failed every scrape)."""
    from aiohttp import web

    from epp.datalayer.httpget import KeepAliveGet

    async def main() -> tuple[list[tuple[int, bytes]], str]:
        async def page(_: web.Request) -> web.Response:
            return web.Response(text="vllm:num_requests_waiting 3\n")

        app = web.Application()
        app.router.add_get("/metrics", page)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        client = KeepAliveGet("127.0.0.1", port, "/metrics")
        got = [await client.get(2.0), await client.get(2.0)]
        await runner.cleanup()
        try:
            await client.get(2.0)
            failure = "none"
        except OSError as e:
            failure = type(e).__name__
        client.close()
        return got, failure

    got, failure = run(main(), loop_factory("uvloop")[1])
    assert got == [(200, b"vllm:num_requests_waiting 3\n")] * 2
    assert failure in ("ConnectionRefusedError", "ConnectionResetError")
