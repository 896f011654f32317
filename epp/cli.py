"""The `epp` command: `epp serve [flags]` (the Go EPP's flags and syntax, see docs/flags.md), `epp validate FILE`.

Like the Go binary, `epp --pool-name=x ...` (flags first, no subcommand) means `epp serve`.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from epp.server.options import Options
    from epp.wiring.runtime import Runtime

log = logging.getLogger("epp")


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "serve":
        return _serve_command(args[1:])
    if args and args[0].startswith("-") and args[0] not in ("-h", "--help"):
        return _serve_command(args)
    parser = argparse.ArgumentParser(
        prog="epp",
        description="Endpoint Picker for LLM inference (Envoy ext_proc). `epp serve --help` lists the serve flags.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    v = sub.add_parser("validate", help="check a config file as `epp serve` would, and exit")
    v.add_argument("file")
    v.add_argument("--allow-experimental-plugins", action="store_true", help="as the serve flag: Alpha plugins load")
    sub.add_parser("serve", help="run the ext_proc server (with gRPC health and /metrics); flags as the Go EPP's")
    ns = parser.parse_args(args)
    if ns.command == "validate":
        from epp.config import ConfigError, load_config
        from epp.wiring import build_runtime

        try:
            config = load_config(ns.file)
            runtime = build_runtime(config)
            check_plugin_stability(runtime, ns.allow_experimental_plugins)
        except (ConfigError, ValueError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        for w in config.warnings:
            print(f"warning: {w}", file=sys.stderr)
        assert runtime.pipeline is not None
        profiles = ", ".join(runtime.pipeline.scheduler.profiles)
        print(f"{ns.file}: ok ({len(runtime.pipeline.plugins)} plugins; profiles: {profiles})")
        return 0
    return 2


def _serve_command(argv: list[str]) -> int:
    from epp.server.goflags import FlagError
    from epp.server.options import FLAGSET, parse_options

    if "-h" in argv or "--help" in argv:
        print("Usage: epp serve [flags]\n\nFlags:\n" + FLAGSET.usage())
        return 0
    try:
        opts = parse_options(argv)
    except FlagError as e:
        print(f"error: {e}\nRun `epp serve --help` for the flags.", file=sys.stderr)
        return 2
    if opts.workers > 1 and opts.worker_index < 0:
        from epp.server.workers import run_workers

        return run_workers(["serve", *argv], opts.workers)
    return _serve(opts)


def _discovery_args(opts: Options) -> argparse.Namespace:
    return argparse.Namespace(
        pool_name=opts.pool_name or None,
        pool_namespace=opts.namespace,
        pool_group=opts.pool_group,
        endpoint_selector=opts.endpoint_selector or None,
        endpoint_target_ports=",".join(str(p) for p in opts.endpoint_target_ports) or None,
        model_server_metrics_port=opts.model_server_metrics_port or None,
        kubeconfig=opts.kubeconfig or None,
    )


def _serve(opts: Options) -> int:
    from epp.server.logsetup import setup_logging
    from epp.server.tls import grpc_tls_environment

    setup_logging(opts)
    for w in opts.warnings:
        log.warning("%s", w)
    try:
        # gRPC reads GRPC_SSL_CIPHER_SUITES once, so it is set before grpc is first imported.
        os.environ.update(grpc_tls_environment(opts))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1

    from epp.config import ConfigError, load_config, parse_config
    from epp.discovery.kubernetes import kubernetes_source_from_args
    from epp.server.runner import BindError, LeaderElectionLost, ServeOptions, serve
    from epp.server.tls import TLSError
    from epp.wiring import build_runtime

    try:
        if opts.config_file:
            config = load_config(opts.config_file)
        else:
            config = parse_config(opts.config_text or "", source="--config-text")
        if opts.pool_name:
            config.pool_name = opts.pool_name
        if opts.cross_replica_address:
            config.share_state_through(opts.cross_replica_address)
        if opts.worker_state_socket:
            config.share_with_workers(opts.worker_state_socket)
        for name, attr in (("refresh-metrics-interval", "refresh_metrics_interval"),
                           ("refresh-prometheus-metrics-interval", "refresh_prometheus_metrics_interval"),
                           ("metrics-staleness-threshold", "metrics_staleness_threshold")):  # fmt: skip
            if opts.given(name):
                setattr(config, attr, getattr(opts, attr))
        runtime = build_runtime(config)
        check_plugin_stability(runtime, opts.allow_experimental_plugins)
        _apply_scrape_flags(runtime, opts)
        if opts.worker_feed:  # `--workers N`: worker 0 scrapes and subscribes, the others are fed from it
            from epp.wiring.feed import attach_feed

            attach_feed(runtime, opts.worker_feed, publish=opts.worker_index == 0)
        k8s = kubernetes_source_from_args(_discovery_args(opts), objectives=runtime.objectives)
        options = ServeOptions.from_flags(opts, kubernetes=k8s is not None)
    except (ConfigError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if k8s is not None and config.discovery_ref is None:  # dataLayer.discovery replaces Kubernetes discovery
        runtime.sources = [k8s]
    from epp.datalayer import health

    health.POLICY.stale_after = opts.endpoint_stale_after if opts.endpoint_stale_after > 0 else float("inf")
    health.POLICY.max_scrape_failures = opts.endpoint_max_scrape_failures or 1 << 30
    if opts.worker_index >= 0 and options.metrics_port:
        options.metrics_port += opts.worker_index
    from epp.server.eventloop import loop_factory, run, set_switch_interval

    set_switch_interval(opts.gil_switch_interval)
    try:
        _, factory = loop_factory(opts.event_loop)
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    try:
        run(serve(runtime, options), factory)
    except (BindError, TLSError, LeaderElectionLost) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


def check_plugin_stability(runtime: Runtime, allow_experimental: bool) -> None:
    """llm-d-router's ValidatePluginStability: an Alpha plugin (`stability` on its class) needs
    --allow-experimental-plugins."""
    from epp.framework import Stability

    if allow_experimental or runtime.pipeline is None:
        return
    for name in sorted(runtime.pipeline.plugins):
        plugin = runtime.pipeline.plugins[name]
        if plugin.stability is Stability.ALPHA:
            raise ValueError(
                f"plugin '{name}' (type: '{plugin.type_name}') has {plugin.stability} stability level, "
                "but command line flag --allow-experimental-plugins is not set"
            )


def _apply_scrape_flags(runtime: Runtime, opts: Options) -> None:
    """GIE v1.5's --model-server-metrics-scheme/path/https-insecure-skip-verify (deprecated there, still in effect)."""
    scraper = runtime.scraper
    if scraper is None:
        return
    if opts.given("model-server-metrics-scheme"):
        scraper.scheme = opts.model_server_metrics_scheme
    if opts.given("model-server-metrics-path"):
        path = opts.model_server_metrics_path
        scraper.path = path if path.startswith("/") else "/" + path
    if opts.given("model-server-metrics-https-insecure-skip-verify"):
        scraper.insecure_skip_verify = opts.model_server_metrics_https_insecure_skip_verify
