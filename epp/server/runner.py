"""Lifecycle of a running EPP: bind the ports, run discovery and background tasks, drain on SIGTERM.

Shutdown order: health NOT_SERVING (so Envoy/Kubernetes stop sending), then `grpc.aio.Server.stop(grace)`,
which refuses new streams and waits up to `drain_timeout` for in-flight ones, then background tasks are cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from dataclasses import dataclass

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from grpc_health.v1 import health_pb2_grpc
from prometheus_client import CollectorRegistry

from epp.framework.labels import DEFAULT_MAX_MODEL_LABELS, configure_label_budgets
from epp.server.extproc import DEFAULT_MAX_BODY_BYTES, ExtProcServicer, ServerState
from epp.server.health import Health
from epp.server.metrics import REGISTRY, RequestMetrics, request_metrics
from epp.server.metrics_http import MetricsHTTP
from epp.server.tls import load_credentials, self_signed_dir
from epp.wiring.runtime import Runtime

log = logging.getLogger(__name__)

# Bodies arrive whole in BUFFERED mode; allow large prompts (the Envoy listener limit is the real cap).
_MAX_MESSAGE = DEFAULT_MAX_BODY_BYTES + 1024 * 1024
_GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", _MAX_MESSAGE),
    ("grpc.max_send_message_length", _MAX_MESSAGE),
]


class BindError(RuntimeError):
    """A listener could not bind its address (port in use, bad address)."""


def _grpc_options(reuse_port: bool) -> list[tuple[str, int]]:
    """SO_REUSEPORT only for `--workers`: otherwise a second EPP on the same port must fail to bind."""
    return [*_GRPC_OPTIONS, ("grpc.so_reuseport", 1 if reuse_port else 0)]


@dataclass
class ServeOptions:
    bind_address: str = "0.0.0.0"
    grpc_port: int = 9002
    grpc_health_port: int = 9003
    metrics_port: int = 9090
    drain_timeout: float = 30.0
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    reuse_port: bool = False
    # TLS on the ext_proc port: a dir with tls.crt/tls.key, or secure_serving=True for a self-signed pair.
    cert_path: str | None = None
    secure_serving: bool = False
    # Distinct client-chosen model names (and fairness ids) that become metric labels; the rest are `__other__`.
    max_model_labels: int = DEFAULT_MAX_MODEL_LABELS


class EppServer:
    """All the EPP's listeners around one Runtime. Ports may be 0; the bound ports are in `self.ports`."""

    def __init__(
        self,
        runtime: Runtime,
        options: ServeOptions,
        registry: CollectorRegistry = REGISTRY,
        metrics: RequestMetrics | None = None,
    ) -> None:
        self.runtime = runtime
        self.options = options
        self.health = Health()
        self.metrics = metrics if metrics is not None else request_metrics(registry)
        rewrites = runtime.config.model_rewrites or {}
        configure_label_budgets(options.max_model_labels, [*rewrites, *rewrites.values()])
        self.state = ServerState(
            runtime.director,
            runtime.datastore,
            self.metrics,
            model_rewrites=runtime.config.model_rewrites,
            max_body_bytes=options.max_body_bytes,
            parsers=runtime.pipeline.parser_registry if runtime.pipeline is not None else None,
        )
        self._grpc = grpc.aio.server(options=_grpc_options(options.reuse_port))
        self._health_grpc = grpc.aio.server(options=_grpc_options(options.reuse_port))
        self._metrics_http = MetricsHTTP(registry, options.bind_address, options.metrics_port)
        self._tasks: list[asyncio.Task[None]] = []
        self.ports: dict[str, int] = {}

    async def start(self) -> None:
        opts = self.options
        pb_grpc.add_ExternalProcessorServicer_to_server(ExtProcServicer(self.state), self._grpc)
        health_pb2_grpc.add_HealthServicer_to_server(self.health.servicer, self._grpc)
        health_pb2_grpc.add_HealthServicer_to_server(self.health.servicer, self._health_grpc)
        credentials = self._credentials()
        for key, server, port, creds in (
            ("grpc", self._grpc, opts.grpc_port, credentials),
            ("health", self._health_grpc, opts.grpc_health_port, None),  # kubelet gRPC probes are plaintext
        ):
            address = f"{opts.bind_address}:{port}"
            try:
                if creds is None:
                    self.ports[key] = server.add_insecure_port(address)
                else:
                    self.ports[key] = server.add_secure_port(address, creds)
            except RuntimeError as e:
                raise BindError(f"cannot bind {key} port {address}: {e}") from None
        await self.health.start()
        await self._grpc.start()
        await self._health_grpc.start()
        try:
            await self._metrics_http.start()
        except OSError as e:
            await self._grpc.stop(0)
            await self._health_grpc.stop(0)
            raise BindError(f"cannot bind metrics port {opts.bind_address}:{opts.metrics_port}: {e}") from None
        self.ports["metrics"] = self._metrics_http.port
        for source in self.runtime.sources:
            self._spawn(source.run(self.runtime.datastore), f"discovery {type(source).__name__}")
        for factory in self.runtime.background:
            self._spawn(factory(), f"background {getattr(factory, '__qualname__', factory)!s}")
        self._spawn(self._watch_readiness(), "readiness")
        log.info("epp serving: ext_proc :%d, health :%d, metrics :%d", *(self.ports[k] for k in self.ports))

    def _credentials(self) -> grpc.ServerCredentials | None:
        opts = self.options
        if opts.cert_path:
            return load_credentials(opts.cert_path)
        if opts.secure_serving:
            return load_credentials(self_signed_dir())
        return None

    def _spawn(self, coro: object, name: str) -> None:
        async def guarded() -> None:
            try:
                await coro  # type: ignore[misc]
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("%s failed", name)

        self._tasks.append(asyncio.create_task(guarded(), name=name))

    async def _watch_readiness(self) -> None:
        """Readiness follows `datastore.synced` (polled: this is not on the request path)."""
        ready = False
        while True:
            synced = bool(self.runtime.datastore.synced)
            if synced != ready:
                ready = synced
                await self.health.set_ready(ready)
                log.info("readiness: %s", "SERVING" if ready else "NOT_SERVING")
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        log.info("shutting down: health NOT_SERVING, draining %d streams", self.state.active_streams)
        for t in self._tasks:
            if t.get_name() == "readiness":
                t.cancel()
        await self.health.shutting_down()
        await self._grpc.stop(self.options.drain_timeout)
        await self._health_grpc.stop(0)
        await self._metrics_http.stop()
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        log.info("stopped")


async def serve(runtime: Runtime, options: ServeOptions) -> None:
    """Run until SIGTERM/SIGINT, then drain and return."""
    server = EppServer(runtime, options)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await server.start()
    await stop.wait()
    await server.stop()
