"""`make stack`: a gateway to poke at. Envoy + the EPP + simulated vLLM pods (real tokenizer, KV cache, KV events
over ZMQ) on loopback, running until Ctrl-C or SIGTERM, which stop everything.

    python -m e2e.stack up                              # 4 pods, pyepp's default config, gateway on :8081
    python -m e2e.stack up --pods 2 --config config/gie-default.yaml --port 9000
    python -m e2e.stack up --sim-args '--max-num-seqs 8 --prefill-tokens-per-second 20000'

It prints the gateway URL, the EPP's metrics URL, the pods and a curl line. `--config` is any EndpointPickerConfig
without an `endpoints:` section (the pods are added to it, each labelled with its KV-event ports so the precise
prefix-cache producer subscribes). Logs go to the printed directory.
"""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import yaml

from e2e.harness.simconfig import sim_endpoints_yaml
from e2e.harness.stack import start_stack
from e2e.sim.launch import start_simulators
from epp.tokenization.qwen import QWEN25_MODEL

SIM_ARGS = ["--block-size", "16", "--model", QWEN25_MODEL]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m e2e.stack", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start the stack and keep it running until Ctrl-C / SIGTERM")
    a = up.add_argument
    a("--pods", type=int, default=4, help="simulated vLLM pods (default 4)")
    a("--config", type=Path, help="EndpointPickerConfig without endpoints (default: pyepp's default config)")
    a("--port", type=int, default=8081, help="the gateway's listener port (default 8081; 0 picks a free one)")
    a("--sim-args", default="", help="more simulator flags for every pod (python -m e2e.sim --help)")
    a("--epp-args", default="", help="more `epp serve` flags (docs/flags.md)")
    a("--workdir", type=Path, help="where logs and the generated configs go (default: a new temporary directory)")
    args = p.parse_args(argv)
    if args.pods < 1:
        p.error("--pods must be at least 1")
    return args


def user_config(path: Path | None) -> str:
    """The user's config (empty: pyepp's default), checked before anything starts."""
    if path is None:
        return ""
    try:
        text = path.read_text()
        parsed = yaml.safe_load(text) or {}
    except (OSError, yaml.YAMLError) as e:
        raise SystemExit(f"error: {path}: {e}") from None
    if not isinstance(parsed, dict):
        raise SystemExit(f"error: {path}: not a YAML mapping (an EndpointPickerConfig)")
    if "endpoints" in parsed:
        raise SystemExit(f"error: {path}: has an `endpoints:` section; the stack adds its own pods")
    return text.rstrip("\n") + "\n"


def interrupt_on_sigterm() -> None:
    """SIGTERM raises KeyboardInterrupt, as Ctrl-C does: every `with`/`finally` stops what it started (also while
    the stack is still starting)."""

    def handler(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, handler)


def up(args: argparse.Namespace) -> int:
    base = user_config(args.config)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="pyepp-stack-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"starting {args.pods} simulated vLLM pods, the EPP and Envoy (logs: {workdir}) ...", flush=True)
    sim_args = [*SIM_ARGS, *shlex.split(args.sim_args)]
    with start_simulators(args.pods, base_args=sim_args, timeout=180) as sims:
        config = base + sim_endpoints_yaml(sims)
        overrides = {"listener_port": args.port} if args.port else None
        stack = start_stack(
            workdir, attempts=1 if args.port else 3, backends=[], config=config,
            envoy_overrides=overrides, epp_args=shlex.split(args.epp_args),
        )  # fmt: skip
        try:
            body = json.dumps({"model": QWEN25_MODEL, "messages": [{"role": "user", "content": "Hello!"}],
                               "max_tokens": 16})  # fmt: skip
            lines = [
                f"gateway      {stack.url}   (OpenAI and Anthropic APIs: /v1/chat/completions, /v1/completions, "
                "/v1/responses, /v1/messages, /v1/embeddings, /v1/models)",
                f"EPP metrics  {stack.epp.metrics_url}",
                f"EPP config   {workdir / 'epp-config.yaml'}" + ("" if args.config else "   (pyepp's default)"),
                *(f"pod {i}        {s.url}   KV events {s.event_endpoint}" for i, s in enumerate(sims)),
                f"model        {QWEN25_MODEL}",
                "",
                f"curl -s {stack.url}/v1/chat/completions -H 'content-type: application/json' -d '{body}'",
                "",
                "Ctrl-C (or SIGTERM) stops everything.",
            ]
            print("\n".join(lines), flush=True)
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt as e:
                print(f"{e.args[0] if e.args else 'SIGINT'}: stopping Envoy, the EPP and the pods", flush=True)
        finally:
            stack.close()
    print("stopped", flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    interrupt_on_sigterm()
    try:
        return up(args)
    except KeyboardInterrupt:  # while starting: everything started is stopped already
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
