"""ServeOptions.from_flags: where --metrics-endpoint-auth (default true) is in effect, and the startup warning
when it is not; readiness following the datastore's sync state."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from epp.datalayer.datastore import Datastore
from epp.server.options import parse_options
from epp.server.runner import ServeOptions
from tests.server.support import bare_server

WARNING = "--metrics-endpoint-auth is on by default but NOT in effect"


@pytest.mark.parametrize(
    ("argv", "kubernetes", "auth", "warned"),
    [
        ([], False, False, True),  # static endpoints / discovery file: open, and said loudly
        ([], True, True, False),  # a Kubernetes API: enforced
        (["--metrics-endpoint-auth=true"], False, True, False),  # asked for explicitly: enforced (needs the API)
        (["--metrics-endpoint-auth=false"], False, False, False),  # turned off: no warning
        (["--metrics-endpoint-auth=false"], True, False, False),
    ],
)
def test_metrics_auth_in_effect_or_said_off(
    caplog: pytest.LogCaptureFixture, argv: list[str], kubernetes: bool, auth: bool, warned: bool
) -> None:
    caplog.set_level(logging.WARNING, logger="epp.server.runner")
    options = ServeOptions.from_flags(parse_options(["--metrics-port=9191", *argv]), kubernetes=kubernetes)
    assert options.metrics_auth is auth
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(WARNING in m and "port 9191" in m for m in messages) is warned, messages


async def test_readiness_follows_sync_both_ways_without_polling() -> None:
    """Readiness is evaluated again when `synced` changes (a Kubernetes re-list sets it False, then True): the
    readiness task sleeps on the change, not on a timer."""
    ds = Datastore()
    server = bare_server(ds)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.ports['health']}") as ch:
            stub = health_pb2_grpc.HealthStub(ch)

            async def settles_at(expected: int) -> bool:
                for _ in range(100):
                    r = await stub.Check(health_pb2.HealthCheckRequest(service="readiness"))
                    if r.status == expected:
                        return True
                    await asyncio.sleep(0.01)
                return False

            assert await settles_at(health_pb2.HealthCheckResponse.NOT_SERVING)
            ds.synced = True
            assert await settles_at(health_pb2.HealthCheckResponse.SERVING)
            ds.synced = False
            assert await settles_at(health_pb2.HealthCheckResponse.NOT_SERVING)
            (task,) = [t for t in server._tasks if t.get_name() == "readiness"]
            assert not task.done()
            awaiting = []  # the coroutines it is suspended in, outermost first
            coro: Any = task.get_coro()
            while coro is not None:
                awaiting.append(coro.cr_code.co_name if hasattr(coro, "cr_code") else type(coro).__name__)
                coro = getattr(coro, "cr_await", None)
            assert "_watch_readiness" in awaiting and "wait" in awaiting and "sleep" not in awaiting, awaiting
    finally:
        await server.stop()
