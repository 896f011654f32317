"""Envoy bootstrap for tests and demos, built from envoy-data-plane's typed config classes and written as JSON.

Shape (GIE's test/testdata/envoy.yaml): listener → HCM → [set_metadata (subset hint)] → ext_proc → router;
`ext_proc` cluster STATIC HTTP/2 at the EPP; `original_destination_cluster` ORIGINAL_DST routing on the
`x-gateway-destination-endpoint` header; an admin listener for /ready and /stats.

    opts = EnvoyOptions(listener_port=..., admin_port=..., ext_proc_port=..., request_body_mode="BUFFERED")
    write_bootstrap(path, opts)

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
from envoy_data_plane.envoy.config.bootstrap.v3 import Admin, Bootstrap, BootstrapStaticResources
from envoy_data_plane.envoy.config.cluster.v3 import (
    Cluster,
    ClusterDiscoveryType,
    ClusterLbPolicy,
    ClusterOriginalDstLbConfig,
)
from envoy_data_plane.envoy.config.core.v3 import (
    Address,
    GrpcService,
    GrpcServiceEnvoyGrpc,
    Http2ProtocolOptions,
    SocketAddress,
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
)
from envoy_data_plane.envoy.extensions.transport_sockets.tls.v3 import (
    CertificateValidationContext,
    CommonTlsContext,
    UpstreamTlsContext,
)
from envoy_data_plane.envoy.extensions.upstreams.http.v3 import (
    HttpProtocolOptions,
    HttpProtocolOptionsExplicitHttpConfig,
)
from envoy_data_plane.google.protobuf import Any as PbAny
from envoy_data_plane.google.protobuf import Struct

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


def _addr(host: str, port: int) -> Address:
    return Address(socket_address=SocketAddress(address=host, port_value=port))


def _any(message: betterproto2.Message) -> PbAny:
    return PbAny.pack(message)


def _duration(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=seconds)


def ext_proc_filter(opts: EnvoyOptions) -> ExternalProcessor:
    req_mode = ProcessingModeBodySendMode[opts.request_body_mode]
    resp_mode = ProcessingModeBodySendMode[opts.response_body_mode or opts.request_body_mode]
    send, skip = ProcessingModeHeaderSendMode.SEND, ProcessingModeHeaderSendMode.SKIP
    duplex = ProcessingModeBodySendMode.FULL_DUPLEX_STREAMED
    return ExternalProcessor(
        grpc_service=GrpcService(envoy_grpc=GrpcServiceEnvoyGrpc(cluster_name=EXT_PROC_CLUSTER), timeout=_duration(10)),
        processing_mode=ProcessingMode(
            request_header_mode=send,
            response_header_mode=send,
            request_body_mode=req_mode,
            response_body_mode=resp_mode,
            # FULL_DUPLEX_STREAMED requires trailer mode SEND (envoy --mode validate rejects it otherwise).
            request_trailer_mode=send if req_mode == duplex else skip,
            response_trailer_mode=send if resp_mode == duplex else skip,
        ),
        message_timeout=_duration(opts.message_timeout_s),
        metadata_options=MetadataOptions(
            forwarding_namespaces=MetadataOptionsMetadataNamespaces(untyped=[SUBSET_NAMESPACE, "envoy.lb"])
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
    return HttpConnectionManager(
        stat_prefix="inference_gateway",
        route_config=RouteConfiguration(
            name="local_route", virtual_hosts=[VirtualHost(name="backend", domains=["*"], routes=[route])]
        ),
        http_filters=filters,
    )


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
        explicit_http_config=HttpProtocolOptionsExplicitHttpConfig(http2_protocol_options=Http2ProtocolOptions())
    )
    ext_proc = Cluster(
        name=EXT_PROC_CLUSTER,
        type=ClusterDiscoveryType.STATIC,
        connect_timeout=_duration(5),
        typed_extension_protocol_options={"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": _any(h2)},
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
