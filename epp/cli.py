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
    s.add_argument("--config", required=True, help="EPP config file (YAML)")
    s.add_argument("--grpc-port", type=int, default=9002)
    s.add_argument("--grpc-health-port", type=int, default=9003)
    s.add_argument("--metrics-port", type=int, default=9090)
    s.add_argument("--bind-address", default="0.0.0.0")
    s.add_argument("--drain-timeout", type=float, default=30.0, help="seconds to let in-flight streams finish")
    s.add_argument("--max-request-body-bytes", type=int, default=128 * 1024 * 1024, help="larger bodies get 413")
    s.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    args = parser.parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    if args.command == "validate":
        from epp.config import ConfigError, load_config

        try:
            load_config(args.file)
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        print(f"{args.file}: ok")
        return 0
    return 2


def _serve(args: argparse.Namespace) -> int:
    from epp.app import build_runtime
    from epp.config import ConfigError, load_config
    from epp.server.runner import BindError, ServeOptions, serve

    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        config = load_config(args.config)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    options = ServeOptions(
        bind_address=args.bind_address,
        grpc_port=args.grpc_port,
        grpc_health_port=args.grpc_health_port,
        metrics_port=args.metrics_port,
        drain_timeout=args.drain_timeout,
        max_body_bytes=args.max_request_body_bytes,
    )
    try:
        asyncio.run(serve(build_runtime(config), options))
    except BindError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0
