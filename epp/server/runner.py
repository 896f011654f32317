"""Lifecycle of a running EPP: bind the ports, run discovery and background tasks, drain on SIGTERM.

Shutdown, as llm-d-router's runner does it (`runWithGracefulShutdown`): on SIGTERM readiness goes NOT_SERVING
(liveness stays SERVING, so the pod is not restarted mid-drain) and the leader Lease is released; ext_proc keeps
serving, new streams included, for the whole `--drain-timeout` window (requests Envoy sends before it sees the pod
leave the endpoints are served, not refused); then the server refuses new streams and waits for the in-flight ones
without a limit of its own (Go's GracefulStop: the pod's terminationGracePeriodSeconds bounds it); then background
tasks are cancelled. A second SIGTERM/SIGINT ends the window and aborts what is still in flight. Losing the Lease
skips the window (the Go EPP exits at once then).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from grpc_health.v1 import health_pb2_grpc
from prometheus_client import CollectorRegistry

from epp.framework.labels import DEFAULT_MAX_MODEL_LABELS, configure_label_budgets
from epp.server.extproc import (
    DEFAULT_BODY_TIMEOUT,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_INFLIGHT_BODY_BYTES,
    ExtProcServicer,
    ServerState,
)
from epp.server.health import Health
from epp.server.metrics import REGISTRY, RequestMetrics, request_metrics
from epp.server.metrics_http import MetricsHTTP
from epp.server.tls import TLSError, load_credentials, self_signed_dir
from epp.wiring.runtime import Runtime

if TYPE_CHECKING:
    from epp.server.leader import LeaderElectionConfig, LeaderElector
    from epp.server.options import Options

log = logging.getLogger(__name__)

# Bodies arrive whole in BUFFERED mode; allow large prompts (the Envoy listener limit is the real cap).
_MAX_MESSAGE = DEFAULT_MAX_BODY_BYTES + 1024 * 1024
# After the drain window in-flight streams finish in their own time (Go's GracefulStop has no limit); grpc.aio
# needs a number, so this is "no limit" in practice: Kubernetes' SIGKILL or a second signal comes first.
_GRACEFUL_STOP_GRACE = 30 * 24 * 3600.0


class BindError(RuntimeError):
    """A listener could not bind its address (port in use, bad address)."""


class LeaderElectionLost(RuntimeError):
    """This replica held the Lease and lost it; like the Go EPP, it exits."""


def _grpc_options(reuse_port: bool, max_recv: int = 0, max_send: int = 0) -> list[tuple[str, int]]:
    """SO_REUSEPORT only for `--workers`: otherwise a second EPP on the same port must fail to bind.
    `max_recv`/`max_send` (--grpc-max-*-msg-size) replace the default limits when set."""
    return [
        ("grpc.max_receive_message_length", max_recv or _MAX_MESSAGE),
        ("grpc.max_send_message_length", max_send or _MAX_MESSAGE),
        ("grpc.so_reuseport", 1 if reuse_port else 0),
    ]


@dataclass
class ServeOptions:
    bind_address: str = "0.0.0.0"
    grpc_port: int = 9002
    grpc_health_port: int = 9003
    metrics_port: int = 9090
    drain_timeout: float = 0.0  # `epp serve` passes --drain-timeout (30s); in-process servers stop without a window
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_inflight_body_bytes: int = DEFAULT_MAX_INFLIGHT_BODY_BYTES
    request_body_timeout: float = DEFAULT_BODY_TIMEOUT
    reuse_port: bool = False
    # TLS on the ext_proc port: a dir with tls.crt/tls.key, or secure_serving=True for a self-signed pair.
    cert_path: str | None = None
    secure_serving: bool = False
    enable_cert_reload: bool = False
    # The gRPC health service on the ext_proc port too (--health-checking; the health port always has it).
    health_checking: bool = True
    grpc_max_recv_bytes: int = 0
    grpc_max_send_bytes: int = 0
    honor_subset_hint: bool = True  # false with --disable-endpoint-subset-filter
    enable_pprof: bool = False
    # --metrics-endpoint-auth: TokenReview + SubjectAccessReview through this kubeconfig ("" = in-cluster/default).
    metrics_auth: bool = False
    kubeconfig: str | None = None
    metrics_cert_dir: str | None = None
    metrics_client_ca_file: str | None = None
    leader_election: LeaderElectionConfig | None = None
    enable_grpc_stream_metrics: bool = False
    tracing: bool = False  # --tracing: OpenTelemetry spans over OTLP (epp.server.tracing)
    # --emit-endpoint-scores: the scheduler's per-endpoint scores in envoy.lb metadata (ServerState carries it).
    emit_endpoint_scores: bool = False
    # Distinct client-chosen model names (and fairness ids) that become metric labels; the rest are `__other__`.
    max_model_labels: int = DEFAULT_MAX_MODEL_LABELS

    @classmethod
    def from_flags(cls, opts: Options, *, kubernetes: bool) -> ServeOptions:
        """The serve flags; metrics auth (default on) is in effect where there is a Kubernetes API to ask, or when
        --metrics-endpoint-auth=true is given explicitly (then a Kubernetes API is required). Left off by default
        without one (static endpoints or a discovery file and no --pool-name/--endpoint-selector; llm-d-router's
        file-discovery mode serves /metrics without auth, silently), it says so at startup."""
        from epp.server.leader import LeaderElectionConfig, lease_name

        auth = opts.metrics_endpoint_auth and (kubernetes or opts.given("metrics-endpoint-auth"))
        if opts.metrics_endpoint_auth and not auth:
            log.warning(
                "--metrics-endpoint-auth is on by default but NOT in effect: this EPP uses no Kubernetes API "
                "(static endpoints or a discovery file, no --pool-name or --endpoint-selector), so /metrics on port %d "
                "is served without authentication. Pass --metrics-endpoint-auth=true (with --kubeconfig) to enforce "
                "it, or --metrics-endpoint-auth=false to serve it open without this warning",
                opts.metrics_port,
            )
        leader = None
        if opts.ha_enable_leader_election:
            if not kubernetes:
                raise ValueError("--ha-enable-leader-election needs Kubernetes discovery (--pool-name)")
            pool = opts.pool_name or "standalone"
            leader = LeaderElectionConfig(namespace=opts.namespace, name=lease_name(opts.namespace, pool))
        return cls(
            bind_address=opts.bind_address,
            grpc_port=opts.grpc_port,
            grpc_health_port=opts.grpc_health_port,
            metrics_port=opts.metrics_port,
            drain_timeout=opts.drain_timeout,
            max_body_bytes=opts.max_request_body_bytes,
            max_inflight_body_bytes=opts.max_inflight_body_bytes,
            request_body_timeout=opts.request_body_timeout,
            reuse_port=opts.worker_index >= 0,
            cert_path=opts.cert_path or None,
            secure_serving=opts.secure_serving,
            enable_cert_reload=opts.enable_cert_reload,
            health_checking=opts.health_checking,
            grpc_max_recv_bytes=opts.grpc_max_recv_bytes,
            grpc_max_send_bytes=opts.grpc_max_send_bytes,
            honor_subset_hint=not opts.disable_endpoint_subset_filter,
            enable_pprof=opts.enable_pprof,
            metrics_auth=auth,
            kubeconfig=opts.kubeconfig or None,
            metrics_cert_dir=opts.metrics_cert_dir or None,
            metrics_client_ca_file=opts.metrics_client_ca_file or None,
            leader_election=leader,
            max_model_labels=opts.metrics_max_model_labels,
            enable_grpc_stream_metrics=opts.enable_grpc_stream_metrics,
            tracing=opts.tracing,
            emit_endpoint_scores=opts.emit_endpoint_scores,
        )


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
            max_inflight_body_bytes=options.max_inflight_body_bytes,
            parsers=runtime.pipeline.parser_registry if runtime.pipeline is not None else None,
        )
        self.state.honor_subset_hint = options.honor_subset_hint
        self.state.body_timeout = options.request_body_timeout
        self.state.emit_endpoint_scores = options.emit_endpoint_scores
        self.tracing: Any = None
        if options.tracing:
            try:
                from epp.server.tracing import start_tracing
            except ImportError as e:  # a broken install must not take routing down with it
                log.error("--tracing: OpenTelemetry cannot be imported (%s); serving without tracing", e)
            else:
                self.tracing = start_tracing()
                self.state.tracing = self.tracing
        self._servicer = ExtProcServicer(self.state)
        if options.enable_grpc_stream_metrics:
            from epp.server.stream_metrics import MeteredExtProcServicer, StreamMetrics

            self._servicer = MeteredExtProcServicer(self.state, StreamMetrics(registry))
        grpc_opts = _grpc_options(options.reuse_port, options.grpc_max_recv_bytes, options.grpc_max_send_bytes)
        self._grpc = grpc.aio.server(options=grpc_opts)
        self._health_grpc = grpc.aio.server(options=_grpc_options(options.reuse_port))
        routes = None
        if options.enable_pprof:
            from epp.server import pprof

            routes = pprof.add_routes
        self._metrics_http = MetricsHTTP(registry, options.bind_address, options.metrics_port, extra_routes=routes)
        self._kube_api: Any = None
        self.elector: LeaderElector | None = None
        self.leadership_lost = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._warmups: list[asyncio.Task[None]] = []
        self.ports: dict[str, int] = {}

    async def _kube(self) -> Any:
        if self._kube_api is None:
            from epp.discovery.kubeclient import api_client

            try:
                self._kube_api = await api_client(self.options.kubeconfig)
            except Exception as e:
                raise BindError(f"cannot reach the Kubernetes API (metrics auth / leader election): {e}") from None
        return self._kube_api

    async def _secure_metrics_http(self) -> None:
        """--metrics-endpoint-auth and --metrics-cert-dir (both need I/O, so they are set up in start())."""
        if self.options.metrics_auth:
            from epp.server.metrics_auth import KubeAuthorizer, auth_middleware

            self._metrics_http.middlewares.append(auth_middleware(KubeAuthorizer(await self._kube())))
        self._metrics_http.ssl_context = self._metrics_ssl()

    def _metrics_ssl(self) -> ssl.SSLContext | None:
        """--metrics-cert-dir: TLS (1.2+) on the metrics port; --metrics-client-ca-file: require client certs."""
        opts = self.options
        if not opts.metrics_cert_dir:
            return None
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        d = Path(opts.metrics_cert_dir)
        try:
            ctx.load_cert_chain(d / "tls.crt", d / "tls.key")
            if opts.metrics_client_ca_file:
                ctx.load_verify_locations(cafile=opts.metrics_client_ca_file)
                ctx.verify_mode = ssl.CERT_REQUIRED
        except (OSError, ssl.SSLError) as e:
            raise TLSError(f"metrics TLS: {e}") from None
        return ctx

    async def start(self) -> None:
        opts = self.options
        pb_grpc.add_ExternalProcessorServicer_to_server(self._servicer, self._grpc)
        if opts.health_checking:
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
        try:
            await self._secure_metrics_http()
        except (BindError, TLSError):
            await self._close_kube()
            raise
        await self._grpc.start()
        await self._health_grpc.start()
        try:
            await self._metrics_http.start()
        except OSError as e:
            await self._grpc.stop(0)
            await self._health_grpc.stop(0)
            await self._close_kube()
            raise BindError(f"cannot bind metrics port {opts.bind_address}:{opts.metrics_port}: {e}") from None
        self.ports["metrics"] = self._metrics_http.port
        if opts.leader_election is not None:
            from epp.server.leader import LeaderElector

            self.elector = LeaderElector(await self._kube(), opts.leader_election)
            self._spawn(self.elector.run(), "leader-election")
            # featureGates haPopulateNonLeaderDatastore (llm-d-router, on by default): a standby keeps its datastore
            # populated (still not ready), so a request that reaches it is routed; =false: the leader only.
            if self.runtime.config.gate("haPopulateNonLeaderDatastore"):
                self._start_sources()
                self._spawn(self._run_when_elected(start_sources=False), "leadership")
            else:
                self._spawn(self._run_when_elected(), "discovery (leader only)")
        else:
            self._start_sources()
        for factory in self.runtime.background:
            self._spawn(factory(), f"background {getattr(factory, '__qualname__', factory)!s}")
        for factory in self.runtime.warmups:
            self._spawn(factory(), f"warm-up {getattr(factory, '__qualname__', factory)!s}")
            self._warmups.append(self._tasks[-1])
        self._spawn(self._watch_readiness(), "readiness")
        log.info("epp serving: ext_proc :%d, health :%d, metrics :%d", *(self.ports[k] for k in self.ports))

    def _start_sources(self) -> None:
        for source in self.runtime.sources:
            self._spawn(source.run(self.runtime.datastore), f"discovery {type(source).__name__}")

    async def _run_when_elected(self, start_sources: bool = True) -> None:
        """Active-passive: only the leader is ready (and, with haPopulateNonLeaderDatastore=false, only the leader
        watches the pool); losing the Lease stops the server."""
        assert self.elector is not None
        await self.elector.elected.wait()
        if start_sources:
            self._start_sources()
        await self.elector.lost.wait()
        if not self._stopping:
            self.leadership_lost.set()

    def _credentials(self) -> grpc.ServerCredentials | None:
        opts = self.options
        if opts.cert_path:
            return load_credentials(opts.cert_path, reload=opts.enable_cert_reload)
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

        task = asyncio.create_task(guarded(), name=name)
        # Cancelled before its first step (a stop right after start), `guarded` never awaits `coro`: close it, or
        # Python warns that it was never awaited.
        close = getattr(coro, "close", None)
        if close is not None:
            task.add_done_callback(lambda t: close() if t.cancelled() else None)
        self._tasks.append(task)

    async def _watch_readiness(self) -> None:
        """Readiness follows `datastore.synced`, leadership and the startup loads: evaluated again whenever one of
        them changes (no polling)."""
        loop = asyncio.get_running_loop()
        changed = asyncio.Event()

        def poke(*_: object) -> None:
            loop.call_soon_threadsafe(changed.set)  # `synced` may be set off the loop's thread

        unwatch = self.runtime.datastore.watch_synced(poke)
        for t in self._warmups:
            t.add_done_callback(poke)
        leadership: asyncio.Task[None] | None = None
        if self.elector is not None:
            elector = self.elector

            async def follow_leadership() -> None:
                await elector.elected.wait()
                poke()
                await elector.lost.wait()
                poke()

            leadership = asyncio.create_task(follow_leadership())
        ready = False
        try:
            while True:
                changed.clear()
                synced = (
                    bool(self.runtime.datastore.synced)
                    and (self.elector is None or self.elector.is_leader)
                    and all(t.done() for t in self._warmups)
                )
                if synced != ready:
                    ready = synced
                    await self.health.set_ready(ready)
                    log.info("readiness: %s", "SERVING" if ready else "NOT_SERVING")
                await changed.wait()
        finally:
            unwatch()
            if leadership is not None:
                leadership.cancel()

    _stopping = False
    _forced: asyncio.Event | None = None

    def force_stop(self) -> None:
        """A second signal: end the drain window now and abort the streams still in flight."""
        if self._forced is None:
            self._forced = asyncio.Event()
        if not self._forced.is_set():
            log.info("second shutdown signal: aborting %d in-flight streams", self.state.active_streams)
            self._forced.set()
            if self._stopping:
                self._spawn(self._grpc.stop(0), "force-stop")

    async def stop(self, *, drain: bool = True) -> None:
        self._stopping = True
        if self._forced is None:
            self._forced = asyncio.Event()
        for t in self._tasks:
            # The elector stops renewing before it releases: a renewal after the release would take the Lease back
            # (it is free by then) and keep the standby waiting out a whole lease duration.
            if t.get_name() in ("readiness", "leader-election"):
                t.cancel()
        await self.health.draining()
        if self.elector is not None:
            await self.elector.release()
        window = self.options.drain_timeout if drain else 0.0
        if window > 0 and not self._forced.is_set():
            log.info(
                "shutting down: readiness NOT_SERVING, ext_proc still serving for the %gs drain window "
                "(%d streams in flight)", window, self.state.active_streams,
            )  # fmt: skip
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._forced.wait(), window)
        log.info("shutting down: refusing new streams, draining %d streams", self.state.active_streams)
        await self.health.shutting_down()
        await self._grpc.stop(0 if self._forced.is_set() else _GRACEFUL_STOP_GRACE)
        await self._health_grpc.stop(0)
        await self._metrics_http.stop()
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        await self._close_kube()
        await self.runtime.close()
        if self.tracing is not None:  # flush what is batched, without hanging on an unreachable collector
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.get_running_loop().run_in_executor(None, self.tracing.shutdown), 5)
        log.info("stopped")

    async def _close_kube(self) -> None:
        if self._kube_api is not None:
            await self._kube_api.close()
            self._kube_api = None


async def serve(runtime: Runtime, options: ServeOptions) -> None:
    """Run until SIGTERM/SIGINT, then drain and return."""
    server = EppServer(runtime, options)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        if stop.is_set():
            server.force_stop()
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    await server.start()
    stopped = asyncio.create_task(stop.wait())
    lost = asyncio.create_task(server.leadership_lost.wait())
    await asyncio.wait({stopped, lost}, return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    lost.cancel()
    await server.stop(drain=not server.leadership_lost.is_set())
    if server.leadership_lost.is_set():
        raise LeaderElectionLost("leader election lost")
