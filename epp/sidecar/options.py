"""The sidecar's flags, as llm-d's pd-sidecar spells them (pflag style: `--flag`, `--flag=true|false`), plus the
same keys in a YAML `--configuration` / `--configuration-file` (flags given on the command line win)."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from epp.framework import parse_duration

NIXLV2 = "nixlv2"
SHARED_STORAGE = "shared-storage"
SUPPORTED_KV_CONNECTORS = (NIXLV2, SHARED_STORAGE)
# llm-d's other connectors (v0.10 accepts these five): recognised, refused with what they would need.
UNSUPPORTED_KV_CONNECTORS = {
    "sglang": "SGLang's bootstrap protocol (prefill and decode sent at once with bootstrap_host/port/room)",
    "mooncake": "vLLM's MooncakeConnector (engine ids from the prefiller's bootstrap server, both legs at once)",
    "offloading": "vLLM's OffloadingConnector P2P tier (the decoder pulls the KV by kv_request_id)",
}
KNOWN_KV_CONNECTORS = (*SUPPORTED_KV_CONNECTORS, *UNSUPPORTED_KV_CONNECTORS)
# E/P/D encoder protocols (llm-d's `--ec-connector`): ec-example primes the encoders' shared-storage cache,
# ec-nixl also hands each encoder's `ec_transfer_params` to the prefill/decode request. Empty: no encoder stage.
EC_EXAMPLE = "ec-example"
EC_NIXL = "ec-nixl"
SUPPORTED_EC_CONNECTORS = (EC_EXAMPLE, EC_NIXL)
TLS_STAGES = ("prefiller", "decoder", "encoder")


class OptionsError(ValueError):
    pass


@dataclass
class SidecarConfig:
    port: int = 8000
    model_server_port: int = 8200
    data_parallel_size: int = 1
    kv_connector: str = NIXLV2
    ec_connector: str = ""
    enable_ssrf_protection: bool = False
    enable_prefiller_sampling: bool = False
    secure_proxy: bool = True
    cert_path: str = ""
    tls_prefiller: bool = False
    tls_decoder: bool = False
    tls_encoder: bool = False
    insecure_prefiller: bool = False
    insecure_decoder: bool = False
    insecure_encoder: bool = False
    inference_pool_namespace: str = ""
    inference_pool_name: str = ""
    pool_group: str = "inference.networking.k8s.io"
    # Our addition: a fixed allowlist of prefiller hosts (IPs or pod names), for deployments without the pool watch.
    allowed_prefillers: list[str] = field(default_factory=list)
    max_idle_conns_per_host: int = 100
    prefill_max_retries: int = 0
    prefill_retry_backoff: float = 0.2
    # Our addition: one prefill attempt may take this long before it counts as failed (then: retry or local prefill).
    prefill_timeout: float = 60.0
    metrics_port: int = 0
    kubeconfig: str | None = None

    @property
    def decoder_scheme(self) -> str:
        return "https" if self.tls_decoder else "http"

    @property
    def prefiller_scheme(self) -> str:
        return "https" if self.tls_prefiller else "http"

    @property
    def encoder_scheme(self) -> str:
        return "https" if self.tls_encoder else "http"


def _bool(v: str) -> bool:
    s = v.strip().lower()
    if s in ("1", "t", "true", "yes"):
        return True
    if s in ("0", "f", "false", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {v!r}")


def _list(v: str) -> list[str]:
    return [s.strip() for s in v.split(",") if s.strip()]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="epp-pd-sidecar", description=__doc__)

    def flag(name: str, help: str) -> None:
        p.add_argument(name, nargs="?", const=True, type=_bool, default=None, help=help)

    p.add_argument("--port", type=int, default=None, help="the port the sidecar listens on (8000)")
    p.add_argument("--model-server-port", type=int, default=None, help="the local model server's port (8200)")
    p.add_argument("--vllm-port", type=int, default=None, help="deprecated: use --model-server-port")
    p.add_argument("--data-parallel-size", type=int, default=None, help="the model server's data-parallel size")
    p.add_argument("--kv-connector", default=None, help=f"KV protocol: {', '.join(SUPPORTED_KV_CONNECTORS)}")
    ec_help = f"encoder protocol (E/P/D): {', '.join(SUPPORTED_EC_CONNECTORS)}; empty: no encoder stage"
    p.add_argument("--ec-connector", default=None, help=ec_help)
    flag("--enable-ssrf-protection", "only prefillers of the InferencePool are allowed")
    flag("--enable-prefiller-sampling", "pick a random prefiller from the header's list")
    flag("--secure-proxy", "serve TLS (default true; self-signed without --cert-path)")
    p.add_argument("--cert-path", default=None, help="directory with tls.crt and tls.key")
    p.add_argument("--enable-tls", action="append", type=_list, default=None, help=", ".join(TLS_STAGES))
    p.add_argument("--tls-insecure-skip-verify", action="append", type=_list, default=None, help="stages")
    p.add_argument("--inference-pool", default=None, help="namespace/name (or name) of the InferencePool")
    p.add_argument("--pool-group", default=None, help="the InferencePool's API group")
    p.add_argument("--allowed-prefillers", type=_list, default=None, help="fixed SSRF allowlist: hosts or pod names")
    p.add_argument("--max-idle-conns-per-host", type=int, default=None)
    p.add_argument("--prefill-max-retries", type=int, default=None, help="retries of a prefill that failed with 5xx")
    p.add_argument("--prefill-retry-backoff", default=None, help="delay between prefill retries (200ms)")
    p.add_argument("--prefill-timeout", default=None, help="limit of one prefill attempt (60s)")
    p.add_argument("--decode-chunk-size", type=int, default=None, help="chunked decode: not supported (0 only)")
    p.add_argument("--metrics-port", type=int, default=None, help="Prometheus /metrics port (0: off)")
    p.add_argument("--kubeconfig", default=None)
    p.add_argument("--configuration", default=None, help="the configuration as inline YAML")
    p.add_argument("--configuration-file", default=None, help="the configuration as a YAML file")
    flag("--tracing", "accepted; tracing is not exported")
    p.add_argument("-v", "--v", dest="verbosity", type=int, default=None, help="log verbosity (1 info, 4 debug)")
    return p


_YAML_KEYS = {
    "port", "model-server-port", "vllm-port", "data-parallel-size", "kv-connector", "ec-connector",
    "enable-ssrf-protection", "enable-prefiller-sampling", "secure-proxy", "cert-path", "enable-tls",
    "tls-insecure-skip-verify", "inference-pool", "pool-group", "max-idle-conns-per-host", "prefill-max-retries",
    "prefill-retry-backoff", "decode-chunk-size", "tracing", "metrics-port", "allowed-prefillers", "prefill-timeout",
}  # fmt: skip


def _yaml(args: argparse.Namespace) -> dict[str, Any]:
    if args.configuration and args.configuration_file:
        raise OptionsError("--configuration and --configuration-file are mutually exclusive")
    text = args.configuration
    if args.configuration_file:
        try:
            text = Path(args.configuration_file).read_text()
        except OSError as e:
            raise OptionsError(f"--configuration-file: {e}") from None
    if not text:
        return {}
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise OptionsError(f"configuration: invalid YAML: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise OptionsError("configuration: expected a mapping of flag names to values")
    unknown = sorted(set(data) - _YAML_KEYS)
    if unknown:
        raise OptionsError(f"configuration: unknown key(s) {', '.join(unknown)}")
    return data


def parse(argv: list[str] | None = None) -> tuple[SidecarConfig, int]:
    """The configuration and the log verbosity; OptionsError names the bad flag."""
    args = parser().parse_args(argv)
    file_values = _yaml(args)

    def get(name: str, default: Any) -> Any:
        v = getattr(args, name.replace("-", "_"))
        if v is not None:
            return v
        return file_values.get(name, default)

    c = SidecarConfig()
    c.port = int(get("port", c.port))
    msp = get("model-server-port", None)
    vp = get("vllm-port", None)
    c.model_server_port = int(msp if msp is not None else vp if vp is not None else c.model_server_port)
    c.data_parallel_size = int(get("data-parallel-size", 1))
    if c.data_parallel_size < 1:
        raise OptionsError("--data-parallel-size must be >= 1")
    c.kv_connector = str(get("kv-connector", NIXLV2))
    if c.kv_connector not in KNOWN_KV_CONNECTORS:
        raise OptionsError(
            f"--kv-connector: unknown {c.kv_connector!r}; supported: {', '.join(SUPPORTED_KV_CONNECTORS)}"
        )
    if c.kv_connector not in SUPPORTED_KV_CONNECTORS:
        why = UNSUPPORTED_KV_CONNECTORS[c.kv_connector]
        raise OptionsError(
            f"--kv-connector {c.kv_connector}: not supported by this sidecar ({why} is not implemented); "
            f"use {', '.join(SUPPORTED_KV_CONNECTORS)}"
        )
    c.ec_connector = str(get("ec-connector", "") or "")
    if c.ec_connector and c.ec_connector not in SUPPORTED_EC_CONNECTORS:
        raise OptionsError(
            f"--ec-connector: unknown {c.ec_connector!r}; supported: {', '.join(SUPPORTED_EC_CONNECTORS)}"
        )
    if int(get("decode-chunk-size", 0)) != 0:
        raise OptionsError("--decode-chunk-size: chunked decode is not supported by this sidecar (use 0)")
    c.enable_ssrf_protection = bool(get("enable-ssrf-protection", False))
    c.enable_prefiller_sampling = bool(get("enable-prefiller-sampling", _env_bool("ENABLE_PREFILLER_SAMPLING")))
    c.secure_proxy = bool(get("secure-proxy", True))
    c.cert_path = str(get("cert-path", "") or "")
    tls = _flat(get("enable-tls", []))
    skip = _flat(get("tls-insecure-skip-verify", []))
    for name, stages in (("--enable-tls", tls), ("--tls-insecure-skip-verify", skip)):
        bad = [s for s in stages if s not in TLS_STAGES]
        if bad:
            raise OptionsError(f"{name}: stages must be one of {', '.join(TLS_STAGES)}, got {', '.join(bad)}")
    c.tls_prefiller, c.tls_decoder = "prefiller" in tls, "decoder" in tls
    c.insecure_prefiller, c.insecure_decoder = "prefiller" in skip, "decoder" in skip
    c.tls_encoder, c.insecure_encoder = "encoder" in tls, "encoder" in skip
    pool = str(get("inference-pool", os.environ.get("INFERENCE_POOL", "")) or "")
    if pool:
        ns, _, name = pool.rpartition("/")
        c.inference_pool_namespace, c.inference_pool_name = ns or "default", name
    c.pool_group = str(get("pool-group", c.pool_group))
    allowed = get("allowed-prefillers", [])
    c.allowed_prefillers = _list(allowed) if isinstance(allowed, str) else [str(a) for a in allowed]
    if c.enable_ssrf_protection and not (c.inference_pool_name or c.allowed_prefillers):
        raise OptionsError(
            "--enable-ssrf-protection needs --inference-pool (or INFERENCE_POOL) or --allowed-prefillers"
        )
    c.max_idle_conns_per_host = int(get("max-idle-conns-per-host", c.max_idle_conns_per_host))
    c.prefill_max_retries = int(get("prefill-max-retries", 0))
    if c.prefill_max_retries < 0:
        raise OptionsError("--prefill-max-retries must be >= 0")
    try:
        c.prefill_retry_backoff = parse_duration(get("prefill-retry-backoff", "200ms"))
        c.prefill_timeout = parse_duration(get("prefill-timeout", "60s"))
    except ValueError as e:
        raise OptionsError(f"--prefill-retry-backoff/--prefill-timeout: {e}") from None
    if c.prefill_timeout <= 0:
        raise OptionsError("--prefill-timeout must be > 0")
    c.metrics_port = int(get("metrics-port", 0))
    c.kubeconfig = args.kubeconfig
    verbosity = args.verbosity if args.verbosity is not None else 1
    return c, verbosity


def _flat(v: Any) -> list[str]:
    if isinstance(v, str):
        return _list(v)
    out: list[str] = []
    for item in v or []:
        out.extend(_flat(item) if not isinstance(item, str) else _list(item))
    return out


def _env_bool(name: str) -> bool:
    try:
        return _bool(os.environ.get(name, "false"))
    except argparse.ArgumentTypeError:
        return False
