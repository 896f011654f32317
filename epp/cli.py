"""The `epp` command: `epp serve --config FILE`, `epp validate FILE`."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="epp", description="Endpoint Picker for LLM inference (Envoy ext_proc)")
    sub = parser.add_subparsers(dest="command", required=True)
    v = sub.add_parser("validate", help="check a config file and exit")
    v.add_argument("file")
    args = parser.parse_args(argv)
    if args.command == "validate":
        from epp.config import ConfigError, load_config
        from epp.config.builder import build_pipeline
        from epp.datastore import Datastore
        from epp.framework import PluginContext

        try:
            config = load_config(args.file)
            pipeline = build_pipeline(config, PluginContext(endpoints=Datastore(), pool_name=config.pool_name))
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        for w in config.warnings:
            print(f"warning: {w}", file=sys.stderr)
        profiles = ", ".join(pipeline.scheduler.profiles)
        print(f"{args.file}: ok ({len(pipeline.plugins)} plugins; profiles: {profiles})")
        return 0
    return 2
