"""Envoy bootstrap for tests and demos, built from envoy-data-plane's typed config classes and written as JSON.

Shape (GIE's test/testdata/envoy.yaml): listener → HCM → [set_metadata (subset hint)] → ext_proc → router;
`ext_proc` cluster STATIC HTTP/2 at the EPP; `original_destination_cluster` ORIGINAL_DST routing on the
`x-gateway-destination-endpoint` header; an admin listener for /ready and /stats.

    opts = EnvoyOptions(listener_port=..., admin_port=..., ext_proc_port=..., request_body_mode="BUFFERED")
    write_bootstrap(path, opts)

Failure handling (the same choices as config/envoy-bootstrap.yaml, see docs/hardening.md): ext_proc fails closed
(`failure_mode_allow: false`, `status_on_error: 503`), the ext_proc cluster's circuit breakers are sized to the EPP
(`ext_proc_max_streams`), and every local reply Envoy generates itself (EPP down or overloaded, upstream connect
failure, timeouts, 413) gets an OpenAI-style JSON body; the EPP's own ImmediateResponses (details `epp_*`) already
have one and pass unchanged.

`subset_listeners` adds one listener per entry whose requests carry the `envoy.lb.subset_hint` filter metadata
(`x-gateway-destination-endpoint-subset: [..]`), injected by Envoy's set_metadata filter and forwarded to the EPP
through `metadata_options.forwarding_namespaces.untyped`.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import betterproto2
from envoy_data_plane.envoy.config.accesslog.v3 import AccessLog, AccessLogFilter, ExtensionFilter
from envoy_data_plane.envoy.config.bootstrap.v3 import Admin, Bootstrap, BootstrapStaticResources
from envoy_data_plane.envoy.config.cluster.v3 import (
    CircuitBreakers,
    CircuitBreakersThresholds,
    Cluster,
    ClusterDiscoveryType,
    ClusterLbPolicy,
    ClusterOriginalDstLbConfig,
    OutlierDetection,
)
from envoy_data_plane.envoy.config.core.v3 import (
    Address,
    GrpcService,
    GrpcServiceEnvoyGrpc,
    Http2ProtocolOptions,
    RetryPolicy,
    RetryPolicyRetryHostPredicate,
    SocketAddress,
    SubstitutionFormatString,
    TransportSocket,
)
from envoy_data_plane.envoy.config.endpoint.v3 import (
    ClusterLoadAssignment,
    Endpoint,
    LbEndpoint,
    LocalityLbEndpoints,
)
from envoy_data_plane.envoy.config.listener.v3 import Filter, FilterChain, Listener
from envoy_data_plane.envoy.config.route.v3 import Route, RouteAction, RouteConfiguration, RouteMatch, VirtualHost
from envoy_data_plane.envoy.extensions.access_loggers.file.v3 import FileAccessLog
from envoy_data_plane.envoy.extensions.access_loggers.filters.cel.v3 import ExpressionFilter
from envoy_data_plane.envoy.extensions.filters.http.ext_proc.v3 import (
    ExternalProcessor,
    MetadataOptions,
    MetadataOptionsMetadataNamespaces,
    ProcessingMode,
    ProcessingModeBodySendMode,
    ProcessingModeHeaderSendMode,
)
from envoy_data_plane.envoy.extensions.filters.http.router.v3 import Router
from envoy_data_plane.envoy.extensions.filters.http.set_metadata.v3 import Config as SetMetadataConfig
from envoy_data_plane.envoy.extensions.filters.http.set_metadata.v3 import Metadata as SetMetadataEntry
from envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 import (
    HttpConnectionManager,
    HttpFilter,
    LocalReplyConfig,
    ResponseMapper,
)
from envoy_data_plane.envoy.extensions.retry.host.previous_hosts.v3 import PreviousHostsPredicate
from envoy_data_plane.envoy.extensions.transport_sockets.tls.v3 import (
    CertificateValidationContext,
    CommonTlsContext,
    UpstreamTlsContext,
)
from envoy_data_plane.envoy.extensions.upstreams.http.v3 import (
    HttpProtocolOptions,
    HttpProtocolOptionsExplicitHttpConfig,
)
from envoy_data_plane.envoy.type.v3 import HttpStatus, StatusCode
from envoy_data_plane.google.protobuf import Any as PbAny
from envoy_data_plane.google.protobuf import Struct

from e2e.harness import picklog

DESTINATION_HEADER = "x-gateway-destination-endpoint"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
EXT_PROC_CLUSTER = "ext_proc"
ORIGINAL_DST_CLUSTER = "original_destination_cluster"
BUFFERED_LIMIT = 16 * 1024 * 1024  # a 2 MB prompt must fit in BUFFERED mode (default 1 MiB gives 413)


@dataclass
class EnvoyOptions:
    listener_port: int
    admin_port: int
    ext_proc_port: int
    host: str = "127.0.0.1"
    ext_proc_host: str = "127.0.0.1"
    request_body_mode: str = "FULL_DUPLEX_STREAMED"  # or "BUFFERED"
    response_body_mode: str | None = None  # default: same as the request mode
    message_timeout_s: float = 10.0
    route_timeout_s: float = 300.0
    per_connection_buffer_limit: int | None = None  # default: 32 KiB streamed (as GIE), 16 MiB buffered
    # TLS to the EPP without verification (GIE: UpstreamTlsContext{common_tls_context:{validation_context:}})
    ext_proc_tls: bool = False
    # False: no ext_proc filter (a baseline for benchmarks; the client must send the destination header itself)
    ext_proc: bool = True
    # extra listener port -> subset hint list sent as envoy.lb.subset_hint filter metadata
    subset_listeners: dict[int, list[str]] = field(default_factory=dict)
    # a baseline listener without ext_proc: the client names the destination itself (for overhead benchmarks)
    direct_port: int | None = None
    # more EPP replicas (ports on ext_proc_host) in the ext_proc cluster, which round-robins streams over them
    extra_ext_proc_ports: list[int] = field(default_factory=list)
    # ext_proc streams (= requests in flight through the EPP) per EPP replica before Envoy sheds with a JSON 503
    ext_proc_max_streams: int = 10_000
    # OpenAI-style JSON bodies on Envoy's own local replies (False: Envoy's plain-text defaults)
    json_local_replies: bool = True
    # False: the ext_proc filter sends no response headers, body or trailers (routing only: the EPP reads no status,
    # TTFT or usage, and the request ends for it when Envoy closes the stream at the response's end)
    response_path: bool = True
    # a file for one JSON line per request with the EPP's pick and scores (e2e.harness.picklog reads it)
    pick_log: str | None = None
    # HTTP/2 streams per connection to an EPP before Envoy opens another (None: Envoy's default, one connection per
    # Envoy thread): several connections let the kernel spread the streams over `epp serve --workers N`
    ext_proc_streams_per_connection: int | None = None


def _addr(host: str, port: int) -> Address:
    return Address(socket_address=SocketAddress(address=host, port_value=port))


def _any(message: betterproto2.Message) -> PbAny:
    return PbAny.pack(message)


def _duration(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=seconds)


def ext_proc_retry_policy() -> RetryPolicy:
    """A stream that could not reach an EPP replica (refused, reset before an answer: the replica died or is
    restarting) is opened again on another replica; a stream the EPP answered is never retried."""
    return RetryPolicy(
        retry_on="connect-failure,refused-stream,reset-before-request,unavailable",
        num_retries=2,
        retry_host_predicate=[
            RetryPolicyRetryHostPredicate(
                name="envoy.retry_host_predicates.previous_hosts", typed_config=_any(PreviousHostsPredicate())
            )
        ],
        host_selection_retry_max_attempts=3,
    )


def ext_proc_outlier_detection() -> OutlierDetection:
    """An EPP replica that refuses connections is taken out of the ext_proc cluster for a while (active health
    checks alone take seconds to notice), so new streams do not try it first; at most all but one replica."""
    return OutlierDetection(
        split_external_local_origin_errors=True,
        consecutive_local_origin_failure=1,
        enforcing_consecutive_local_origin_failure=100,
        interval=_duration(1),
        base_ejection_time=_duration(5),
        max_ejection_percent=50,
    )


def ext_proc_filter(opts: EnvoyOptions) -> ExternalProcessor:
    req_mode = ProcessingModeBodySendMode[opts.request_body_mode]
    resp_mode = ProcessingModeBodySendMode[opts.response_body_mode or opts.request_body_mode]
    send, skip = ProcessingModeHeaderSendMode.SEND, ProcessingModeHeaderSendMode.SKIP
    duplex = ProcessingModeBodySendMode.FULL_DUPLEX_STREAMED
    if not opts.response_path:
        resp_mode = ProcessingModeBodySendMode.NONE
    return ExternalProcessor(
        grpc_service=GrpcService(
            envoy_grpc=GrpcServiceEnvoyGrpc(cluster_name=EXT_PROC_CLUSTER),
            timeout=_duration(10),
            retry_policy=ext_proc_retry_policy(),
        ),
        processing_mode=ProcessingMode(
            request_header_mode=send,
            response_header_mode=send if opts.response_path else skip,
            request_body_mode=req_mode,
            response_body_mode=resp_mode,
            # FULL_DUPLEX_STREAMED requires trailer mode SEND (envoy --mode validate rejects it otherwise).
            request_trailer_mode=send if req_mode == duplex else skip,
            response_trailer_mode=send if resp_mode == duplex else skip,
        ),
        message_timeout=_duration(opts.message_timeout_s),
        # Fail closed: without the EPP there is no destination header, and the original-destination cluster could
        # only fail later with a less telling error. Envoy answers 503 (JSON, see local_reply_config) instead of 500.
        failure_mode_allow=False,
        status_on_error=HttpStatus(code=StatusCode.ServiceUnavailable),
        # envoy.lb is also received back: the EPP's pick and scores become dynamic metadata for the pick log
        metadata_options=MetadataOptions(
            forwarding_namespaces=MetadataOptionsMetadataNamespaces(untyped=[SUBSET_NAMESPACE, "envoy.lb"]),
            receiving_namespaces=MetadataOptionsMetadataNamespaces(untyped=["envoy.lb"]),
        ),
    )


def _hcm(opts: EnvoyOptions, subset: list[str] | None, ext_proc: bool = True) -> HttpConnectionManager:
    filters: list[HttpFilter] = []
    if subset is not None:
        value = Struct.from_dict({SUBSET_KEY: list(subset)})
        meta = SetMetadataConfig(metadata=[SetMetadataEntry(metadata_namespace=SUBSET_NAMESPACE, value=value)])
        filters.append(HttpFilter(name="envoy.filters.http.set_metadata", typed_config=_any(meta)))
    if opts.ext_proc and ext_proc:
        filters.append(HttpFilter(name="envoy.filters.http.ext_proc", typed_config=_any(ext_proc_filter(opts))))
    filters.append(HttpFilter(name="envoy.filters.http.router", typed_config=_any(Router(suppress_envoy_headers=True))))
    route = Route(
        match=RouteMatch(prefix="/"),
        route=RouteAction(
            cluster=ORIGINAL_DST_CLUSTER,
            timeout=_duration(opts.route_timeout_s),
            idle_timeout=_duration(opts.route_timeout_s),
        ),
    )
    access_log = []
    if opts.pick_log is not None:
        fmt = SubstitutionFormatString(json_format=Struct.from_dict(dict(picklog.ACCESS_LOG_FORMAT)))
        file_log = FileAccessLog(path=opts.pick_log, log_format=fmt)
        access_log.append(AccessLog(name="envoy.access_loggers.file", typed_config=_any(file_log)))
    return HttpConnectionManager(
        stat_prefix="inference_gateway",
        access_log=access_log,
        local_reply_config=local_reply_config() if opts.json_local_replies else None,
        request_headers_timeout=_duration(10),
        request_timeout=_duration(150),  # as config/envoy-bootstrap.yaml: bounds request-body time
        route_config=RouteConfiguration(
            name="local_route", virtual_hosts=[VirtualHost(name="backend", domains=["*"], routes=[route])]
        ),
        http_filters=filters,
    )


def _cel(expression: str) -> AccessLogFilter:
    return AccessLogFilter(
        extension_filter=ExtensionFilter(
            name="envoy.access_loggers.extension_filters.cel",
            typed_config=_any(ExpressionFilter(expression=expression)),
        )
    )


def _json_error(message: str, kind: str) -> SubstitutionFormatString:
    body = Struct.from_dict({"error": {"message": message, "type": kind, "code": "%RESPONSE_CODE%"}})
    return SubstitutionFormatString(json_format=body, content_type="application/json")


def local_reply_config() -> LocalReplyConfig:
    """Envoy's own local replies in the OpenAI error shape; the EPP's ImmediateResponses (details `epp_*`) are
    already JSON and are left alone. ext_proc failures (EPP down, overloaded: circuit breaker, message timeout)
    say so; other local replies (upstream connect failure, timeouts, 413...) carry Envoy's text and details."""
    # The client's headers were within Envoy's limits (100 headers, 60 KiB), but not once the EPP's routing headers
    # are added: Envoy refuses the mutation with a 503, though the request is what is too large.
    headers = ResponseMapper(
        filter=_cel("response.code_details == 'header_mutation_result_exceeds_limit'"),
        status_code=431,
        body_format_override=_json_error(
            "request headers too large once the endpoint picker's routing headers are added",
            "RequestHeaderFieldsTooLarge",
        ),
    )
    ext_proc = ResponseMapper(
        filter=_cel("response.code_details.startsWith('ext_proc')"),
        body_format_override=_json_error("the endpoint picker is unavailable or overloaded", "ServiceUnavailable"),
    )
    other = ResponseMapper(
        filter=_cel("!response.code_details.startsWith('epp_')"),
        body_format_override=_json_error("%LOCAL_REPLY_BODY%", "%RESPONSE_CODE_DETAILS%"),
    )
    return LocalReplyConfig(mappers=[headers, ext_proc, other])


def _listener(name: str, opts: EnvoyOptions, port: int, subset: list[str] | None, ext_proc: bool = True) -> Listener:
    limit = opts.per_connection_buffer_limit
    if limit is None:
        limit = BUFFERED_LIMIT if opts.request_body_mode == "BUFFERED" else 32768
    hcm = Filter(name="envoy.filters.network.http_connection_manager", typed_config=_any(_hcm(opts, subset, ext_proc)))
    return Listener(
        name=name,
        address=_addr(opts.host, port),
        per_connection_buffer_limit_bytes=limit,
        filter_chains=[FilterChain(filters=[hcm])],
    )


def build_bootstrap(opts: EnvoyOptions) -> Bootstrap:
    h2 = HttpProtocolOptions(
        explicit_http_config=HttpProtocolOptionsExplicitHttpConfig(
            http2_protocol_options=Http2ProtocolOptions(max_concurrent_streams=opts.ext_proc_streams_per_connection)
        )
    )
    ext_proc = Cluster(
        name=EXT_PROC_CLUSTER,
        type=ClusterDiscoveryType.STATIC,
        connect_timeout=_duration(5),
        typed_extension_protocol_options={"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": _any(h2)},
        # Each request is one ext_proc stream: Envoy's default (1,024 requests) would turn load above that into
        # ext_proc errors. Sized to what the EPP replicas hold; past it Envoy answers 503 with a JSON body.
        circuit_breakers=CircuitBreakers(
            thresholds=[
                CircuitBreakersThresholds(
                    max_requests=opts.ext_proc_max_streams * (1 + len(opts.extra_ext_proc_ports)),
                    max_pending_requests=opts.ext_proc_max_streams,
                    max_connections=1024,
                )
            ]
        ),
        outlier_detection=ext_proc_outlier_detection(),
        load_assignment=ClusterLoadAssignment(
            cluster_name=EXT_PROC_CLUSTER,
            endpoints=[
                LocalityLbEndpoints(
                    lb_endpoints=[
                        LbEndpoint(endpoint=Endpoint(address=_addr(opts.ext_proc_host, port)))
                        for port in (opts.ext_proc_port, *opts.extra_ext_proc_ports)
                    ]
                )
            ],
        ),
    )
    if opts.ext_proc_tls:
        tls = UpstreamTlsContext(
            common_tls_context=CommonTlsContext(
                alpn_protocols=["h2"], validation_context=CertificateValidationContext()
            )
        )
        ext_proc.transport_socket = TransportSocket(name="envoy.transport_sockets.tls", typed_config=_any(tls))
    original_dst = Cluster(
        name=ORIGINAL_DST_CLUSTER,
        type=ClusterDiscoveryType.ORIGINAL_DST,
        lb_policy=ClusterLbPolicy.CLUSTER_PROVIDED,
        connect_timeout=_duration(5),
        original_dst_lb_config=ClusterOriginalDstLbConfig(use_http_header=True, http_header_name=DESTINATION_HEADER),
    )
    listeners = [_listener("gateway", opts, opts.listener_port, None)]
    for port, subset in opts.subset_listeners.items():
        listeners.append(_listener(f"gateway-subset-{port}", opts, port, subset))
    if opts.direct_port is not None:
        listeners.append(_listener("direct", opts, opts.direct_port, None, ext_proc=False))
    return Bootstrap(
        admin=Admin(address=_addr(opts.host, opts.admin_port)),
        static_resources=BootstrapStaticResources(listeners=listeners, clusters=[ext_proc, original_dst]),
    )


def bootstrap_dict(opts: EnvoyOptions) -> dict[str, Any]:
    return build_bootstrap(opts).to_dict()


def write_bootstrap(path: str | Path, opts: EnvoyOptions) -> Path:
    p = Path(path)
    p.write_text(json.dumps(bootstrap_dict(opts), indent=1))
    return p
