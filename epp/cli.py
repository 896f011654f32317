"""The `epp` command: `epp serve --config FILE`, `epp validate FILE`."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="epp", description="Endpoint Picker for LLM inference (Envoy ext_proc)")
    sub = parser.add_subparsers(dest="command", required=True)
    v = sub.add_parser("validate", help="check a config file and exit")
    v.add_argument("file")
    s = sub.add_parser("serve", help="run the ext_proc server (with gRPC health and /metrics)")
    s.add_argument("--config", "--config-file", dest="config", help="EPP config file (YAML); default: GIE defaults")
    s.add_argument("--config-text", help="EPP config as inline YAML (instead of --config)")
    s.add_argument("--grpc-port", type=int, default=9002)
    s.add_argument("--grpc-health-port", type=int, default=9003)
    s.add_argument("--metrics-port", type=int, default=9090)
    s.add_argument("--bind-address", default="0.0.0.0")
    s.add_argument("--drain-timeout", type=float, default=30.0, help="seconds to let in-flight streams finish")
    s.add_argument("--max-request-body-bytes", type=int, default=128 * 1024 * 1024, help="larger bodies get 413")
    s.add_argument(
        "--metrics-max-model-labels",
        type=int,
        default=100,
        help="distinct model names (and fairness ids) that become metric labels; the rest count as __other__",
    )
    s.add_argument(
        "--endpoint-stale-after",
        type=float,
        default=1.0,
        help="seconds without a good metrics scrape after which an endpoint is not routed to (0: never stale)",
    )
    s.add_argument(
        "--endpoint-max-scrape-failures",
        type=int,
        default=2,
        help="consecutive failed scrapes after which an endpoint is not routed to (0: scrapes never demote)",
    )
    s.add_argument(
        "--secure-serving", action="store_true", help="TLS on the ext_proc port (self-signed if no --cert-path)"
    )
    s.add_argument("--cert-path", help="directory with tls.crt and tls.key for the ext_proc port (implies TLS)")
    s.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    s.add_argument("--workers", type=int, default=1, help="EPP processes sharing the ports (SO_REUSEPORT)")
    s.add_argument("--worker-index", type=int, default=None, help=argparse.SUPPRESS)
    from epp.discovery.kubernetes import add_kubernetes_args

    add_kubernetes_args(s)
    args = parser.parse_args(argv)
    if args.command == "serve":
        if args.workers > 1 and args.worker_index is None:
            from epp.server.workers import run_workers

            return run_workers(sys.argv[1:] if argv is None else argv, args.workers)
        return _serve(args)
    if args.command == "validate":
        from epp.config import ConfigError, load_config
        from epp.datalayer.datastore import Datastore
        from epp.wiring import build_pipeline, plugin_context, register_builtins

        register_builtins()
        try:
            config = load_config(args.file)
            pipeline = build_pipeline(config, plugin_context(Datastore(), config.pool_name))
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        for w in config.warnings:
            print(f"warning: {w}", file=sys.stderr)
        profiles = ", ".join(pipeline.scheduler.profiles)
        print(f"{args.file}: ok ({len(pipeline.plugins)} plugins; profiles: {profiles})")
        return 0
    return 2


def _serve(args: argparse.Namespace) -> int:
    from epp.config import ConfigError, load_config, parse_config
    from epp.discovery.kubernetes import kubernetes_source_from_args
    from epp.server.runner import BindError, ServeOptions, serve
    from epp.server.tls import TLSError
    from epp.wiring import build_runtime

    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if args.config and args.config_text:
        print("error: give --config or --config-text, not both", file=sys.stderr)
        return 1
    try:
        if args.config:
            config = load_config(args.config)
        else:
            config = parse_config(args.config_text or "", source="--config-text")
        if args.pool_name:
            config.pool_name = args.pool_name
        runtime = build_runtime(config)
        k8s = kubernetes_source_from_args(args, objectives=runtime.objectives)
    except (ConfigError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if k8s is not None and config.discovery_ref is None:  # dataLayer.discovery replaces Kubernetes discovery
        runtime.sources = [k8s]
    from epp.datalayer import health

    health.POLICY.stale_after = args.endpoint_stale_after if args.endpoint_stale_after > 0 else float("inf")
    health.POLICY.max_scrape_failures = args.endpoint_max_scrape_failures or 1 << 30
    options = ServeOptions(
        bind_address=args.bind_address,
        grpc_port=args.grpc_port,
        grpc_health_port=args.grpc_health_port,
        metrics_port=args.metrics_port,
        drain_timeout=args.drain_timeout,
        max_body_bytes=args.max_request_body_bytes,
        reuse_port=args.worker_index is not None,
        cert_path=args.cert_path,
        secure_serving=args.secure_serving,
        max_model_labels=args.metrics_max_model_labels,
    )
    if args.worker_index is not None and options.metrics_port:
        options.metrics_port += args.worker_index
    try:
        asyncio.run(serve(runtime, options))
    except (BindError, TLSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0
