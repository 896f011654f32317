"""`epp serve` flags: every flag of llm-d-router v0.10's `cmd/epp` (pkg/epp/server/options.go, the logging options)
and GIE v1.5's, with their names, Go syntax and defaults, plus pyepp's own. See docs/flags.md.

Parsing is goflags.FlagSet (pflag semantics); `Options.validate` applies the anchors' Complete()/Validate() rules
(deprecated metric flags rejected, metrics TLS needs auth, config-file xor config-text, TLS version/cipher names).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from epp.server.goflags import Flag, FlagError, FlagSet, Parsed, parse_quantity_bytes

# Rejected when set (v0.10 and GIE v1.5): metric names come from engineConfigs in the EndpointPickerConfig.
DEPRECATED_METRIC_FLAGS = (
    "total-queued-requests-metric",
    "total-running-requests-metric",
    "kv-cache-usage-percentage-metric",
    "lora-info-metric",
    "cache-info-metric",
)

# Go crypto/tls cipher suite names (tls.CipherSuites() + tls.InsecureCipherSuites()) -> the OpenSSL/BoringSSL names
# gRPC takes in GRPC_SSL_CIPHER_SUITES; None: Go knows it but gRPC's BoringSSL does not offer it. TLS 1.3 suites
# map to "" (accepted, not configurable: as in Go, the flag only affects TLS 1.2).
GO_CIPHER_SUITES: dict[str, str | None] = {
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_AES_128_GCM_SHA256": "",
    "TLS_AES_256_GCM_SHA384": "",
    "TLS_CHACHA20_POLY1305_SHA256": "",
    "TLS_RSA_WITH_RC4_128_SHA": None,
    "TLS_RSA_WITH_3DES_EDE_CBC_SHA": None,
    "TLS_RSA_WITH_AES_128_CBC_SHA256": None,
    "TLS_ECDHE_ECDSA_WITH_RC4_128_SHA": None,
    "TLS_ECDHE_RSA_WITH_RC4_128_SHA": None,
    "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA": None,
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256": None,
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256": None,
}

TLS_VERSIONS = {"VersionTLS10": "1.0", "VersionTLS11": "1.1", "VersionTLS12": "1.2", "VersionTLS13": "1.3"}

ZAP_LEVELS = ("debug", "info", "error", "panic")
ZAP_ENCODERS = ("json", "console")
ZAP_TIME_ENCODINGS = ("epoch", "millis", "nano", "iso8601", "rfc3339", "rfc3339nano")
LOG_LEVELS = ("debug", "info", "warning", "error")


@dataclass
class Options:
    """Flag values; durations in seconds. Field names are the flag names with '-' as '_'."""

    # ext_proc
    grpc_port: int = 9002
    ha_enable_leader_election: bool = False
    drain_timeout: float = 30.0
    grpc_max_recv_msg_size: str = ""
    grpc_max_send_msg_size: str = ""
    # InferencePool / standalone endpoints
    pool_group: str = "inference.networking.k8s.io"
    pool_namespace: str = ""
    pool_name: str = ""
    endpoint_selector: str = ""
    endpoint_target_ports: list[int] = field(default_factory=list)
    disable_endpoint_subset_filter: bool = False
    emit_endpoint_scores: bool = False
    # model server metrics
    refresh_metrics_interval: float = 0.05
    refresh_prometheus_metrics_interval: float = 5.0
    metrics_staleness_threshold: float = 2.0
    total_queued_requests_metric: str = "vllm:num_requests_waiting"
    total_running_requests_metric: str = "vllm:num_requests_running"
    kv_cache_usage_percentage_metric: str = "vllm:kv_cache_usage_perc"
    lora_info_metric: str = "vllm:lora_requests_info"
    cache_info_metric: str = "vllm:cache_config_info"
    model_server_metrics_scheme: str = "http"
    model_server_metrics_path: str = "/metrics"
    model_server_metrics_port: int = 0
    model_server_metrics_https_insecure_skip_verify: bool = True
    # logging (controller-runtime zap options; -v)
    v: int = 2
    zap_devel: bool = True
    zap_encoder: str = ""
    zap_log_level: str = ""
    zap_stacktrace_level: str = ""
    zap_time_encoding: str = ""
    # diagnostics and serving
    tracing: bool = True
    health_checking: bool = False
    metrics_port: int = 9090
    grpc_health_port: int = 9003
    enable_pprof: bool = True
    cert_path: str = ""
    enable_cert_reload: bool = False
    enable_grpc_stream_metrics: bool = False
    secure_serving: bool = True
    tls_min_version: str = ""
    tls_cipher_suites: list[str] = field(default_factory=list)
    metrics_endpoint_auth: bool = True
    metrics_client_ca_file: str = ""
    metrics_cert_dir: str = ""
    # configuration
    config_file: str = ""
    config_text: str = ""
    allow_experimental_plugins: bool = False
    # pyepp's own
    bind_address: str = "0.0.0.0"
    max_request_body_bytes: int = 128 * 1024 * 1024
    max_inflight_body_bytes: int = 256 * 1024 * 1024
    request_body_timeout: float = 30.0
    metrics_max_model_labels: int = 100
    endpoint_stale_after: float = 1.0
    endpoint_max_scrape_failures: int = 2
    log_level: str = ""
    workers: int = 1
    event_loop: str = "auto"
    gil_switch_interval: float = 0.0
    worker_index: int = -1
    worker_state_socket: str = ""
    worker_feed: str = ""
    kubeconfig: str = ""
    cross_replica_address: str = ""

    changed: set[str] = field(default_factory=set)
    warnings: list[str] = field(default_factory=list)
    # Filled by validate().
    grpc_max_recv_bytes: int = 0
    grpc_max_send_bytes: int = 0

    def given(self, name: str) -> bool:
        """Whether --name was on the command line (pflag's Changed)."""
        return name in self.changed

    @property
    def namespace(self) -> str:
        """--pool-namespace, else $NAMESPACE, else default (as the anchors)."""
        return self.pool_namespace or os.environ.get("NAMESPACE") or "default"

    def _unquoted_metrics_path(self) -> str:
        """A path in quotes (`--model-server-metrics-path="/x"` in a container's args, where no shell strips them) loses
        them, loudly: the Go EPPs keep them and every scrape of `/%22/x%22` fails with a debug-level 404."""
        path = self.model_server_metrics_path
        if len(path) >= 2 and path[0] == path[-1] and path[0] in "\"'":
            self.warnings.append(
                f"--model-server-metrics-path={path}: the quotes are not part of the path (container args are not "
                f"unquoted by a shell); scraping {path[1:-1]!r}"
            )
            return path[1:-1]
        return path

    def validate(self) -> None:
        """The anchors' Complete() + Validate(); raises FlagError with the flag's name."""
        for name in DEPRECATED_METRIC_FLAGS:
            if self.given(name):
                raise FlagError(
                    f'flag "{name}" is deprecated and cannot be used; '
                    "configure metrics via engineConfigs in EndpointPickerConfig instead"
                )
        if self.config_file and self.config_text:
            raise FlagError('both the "config-file" and "config-text" flags cannot be set at the same time')
        for attr, flag in (("grpc_max_recv_msg_size", "grpc-max-recv-msg-size"),
                           ("grpc_max_send_msg_size", "grpc-max-send-msg-size")):  # fmt: skip
            text = getattr(self, attr)
            if text:
                try:
                    size = parse_quantity_bytes(text)
                except ValueError as e:
                    raise FlagError(f"invalid {flag}: {e}") from None
                if size > 2**31 - 1:
                    raise FlagError(f"{flag} overflows gRPC's 32-bit message size limit: {size}")
                setattr(self, attr.replace("_msg_size", "_bytes"), size)
        if self.metrics_client_ca_file and not Path(self.metrics_client_ca_file).is_file():
            raise FlagError(f"metrics TLS cert file unreadable: {self.metrics_client_ca_file}")
        if self.metrics_cert_dir:
            for name in ("tls.crt", "tls.key"):
                p = Path(self.metrics_cert_dir) / name
                if not p.is_file():
                    raise FlagError(f"metrics TLS cert file unreadable: {p}")
        if self.tls_min_version and self.tls_min_version not in TLS_VERSIONS:
            raise FlagError(
                f'invalid tls-min-version "{self.tls_min_version}": unknown TLS version; '
                "supported values: VersionTLS10, VersionTLS11, VersionTLS12, VersionTLS13"
            )
        if self.tls_min_version in ("VersionTLS10", "VersionTLS11"):
            raise FlagError(
                f"tls-min-version {self.tls_min_version}: gRPC's TLS stack never negotiates below TLS 1.2, "
                "so the minimum is VersionTLS12 (the default) or VersionTLS13"
            )
        for name in self.tls_cipher_suites:
            name = name.strip()
            if not name:
                continue
            if name not in GO_CIPHER_SUITES:
                raise FlagError(f'invalid tls-cipher-suites: unknown cipher suite "{name}"')
            if GO_CIPHER_SUITES[name] is None:
                raise FlagError(f'invalid tls-cipher-suites: "{name}" is not available in gRPC\'s TLS stack')
        if self.metrics_client_ca_file and not self.metrics_cert_dir:
            raise FlagError('"metrics-client-ca-file" requires "metrics-cert-dir"')
        if self.metrics_cert_dir and not self.metrics_client_ca_file and not self.metrics_endpoint_auth:
            raise FlagError(
                '"metrics-cert-dir" enables metrics TLS without authentication; '
                'set "metrics-client-ca-file" or "metrics-endpoint-auth"'
            )
        if self.model_server_metrics_scheme not in ("http", "https"):
            raise FlagError(
                f'unexpected "{self.model_server_metrics_scheme}" value for "model-server-metrics-scheme" flag, '
                "it can only be set to 'http' or 'https'"
            )
        self.model_server_metrics_path = self._unquoted_metrics_path()
        _choice(self.zap_encoder, ZAP_ENCODERS, "zap-encoder")
        _choice(self.zap_time_encoding, ZAP_TIME_ENCODINGS, "zap-time-encoding")
        _choice(self.zap_stacktrace_level, ("info", "error", "panic"), "zap-stacktrace-level")
        _choice(self.log_level, LOG_LEVELS, "log-level")
        if self.zap_log_level and self.zap_log_level not in ZAP_LEVELS:
            try:
                if int(self.zap_log_level) <= 0:
                    raise ValueError
            except ValueError:
                raise FlagError(
                    f'invalid argument "{self.zap_log_level}" for "--zap-log-level" flag: '
                    "want debug, info, error, panic or an integer > 0"
                ) from None
        if self.v < 0:
            self.v = 2  # the anchor's LoggingOptions.Validate resets a negative -v to DEFAULT
        self.endpoint_target_ports = list(dict.fromkeys(self.endpoint_target_ports))
        for name in ("grpc-port", "grpc-health-port", "metrics-port"):
            port = getattr(self, name.replace("-", "_"))
            if not 0 <= port < 65536:
                raise FlagError(f"--{name}: port {port} is out of range")
        if self.workers < 1:
            raise FlagError(f"--workers must be >= 1, got {self.workers}")
        _choice(self.event_loop, ("auto", "asyncio", "uvloop"), "event-loop")
        if self.gil_switch_interval < 0:
            raise FlagError("--gil-switch-interval must not be negative")
        for name in ("drain-timeout", "refresh-metrics-interval", "refresh-prometheus-metrics-interval",
                     "metrics-staleness-threshold", "request-body-timeout"):  # fmt: skip
            if getattr(self, name.replace("-", "_")) < 0:
                raise FlagError(f"--{name} must not be negative")
        if self.refresh_metrics_interval == 0 or self.refresh_prometheus_metrics_interval == 0:
            raise FlagError("--refresh-metrics-interval and --refresh-prometheus-metrics-interval must be > 0")


def _choice(value: str, choices: tuple[str, ...], flag: str) -> None:
    if value and value not in choices:
        raise FlagError(f'invalid argument "{value}" for "--{flag}" flag: want one of {", ".join(choices)}')


_ENGINE = "use engineConfigs in EndpointPickerConfig instead"
_DATALAYER = "This flag is deprecated. Configure via EndpointPickerConfig data layer plugin parameters instead."

FLAGS: tuple[Flag, ...] = (
    Flag("grpc-port", "int", "gRPC port used for communicating with Envoy proxy."),
    Flag("ha-enable-leader-election", "bool",
         "Enables leader election for high availability (active-passive on a coordination.k8s.io Lease). When "
         "enabled, readiness probes will only pass on the leader. Without it every replica is active."),
    Flag("drain-timeout", "duration",
         "Graceful shutdown drain window: on SIGTERM the EPP goes NotServing and releases its leader lease "
         "immediately, then keeps serving ext_proc for this duration so in-flight and pre-DNS-refresh requests are "
         "not rejected; then it refuses new streams and lets the in-flight ones finish."),
    Flag("grpc-max-recv-msg-size", "string", "Maximum size of a gRPC message to receive (e.g., 10MiB, 25MB)."),
    Flag("grpc-max-send-msg-size", "string", "Maximum size of a gRPC message to send (e.g., 10MiB, 25MB)."),
    Flag("pool-group", "string", "Kubernetes resource group of the InferencePool this Endpoint Picker serves."),
    Flag("pool-namespace", "string",
         "Namespace of the InferencePool this Endpoint Picker serves (default: $NAMESPACE, else default)."),
    Flag("pool-name", "string", "Name of the InferencePool this Endpoint Picker serves."),
    Flag("endpoint-selector", "string",
         "Standalone mode (no InferencePool): label selector of the model server pods, e.g. 'app=vllm,env=prod'."),
    Flag("endpoint-target-ports", "ints", "Standalone mode: target ports of the model server pods, e.g. '8000,8001'."),
    Flag("disable-endpoint-subset-filter", "bool",
         "Disables respecting the destination endpoint subset metadata for dispatching requests in EPP."),
    Flag("emit-endpoint-scores", "bool",
         "Emit the scheduler's per-endpoint scores in the request-path dynamic metadata under the "
         "'x-gateway-destination-endpoint-scores' key of the 'envoy.lb' namespace."),
    Flag("refresh-metrics-interval", "duration", "Interval to refresh metrics."),
    Flag("refresh-prometheus-metrics-interval", "duration", "Interval to flush Prometheus metrics."),
    Flag("metrics-staleness-threshold", "duration", "Duration after which metrics are considered stale."),
    Flag("total-queued-requests-metric", "string", "Prometheus metric for the number of queued requests.",
         deprecated=_ENGINE),
    Flag("total-running-requests-metric", "string", "Prometheus metric for the number of running requests.",
         deprecated=_ENGINE),
    Flag("kv-cache-usage-percentage-metric", "string", "Prometheus metric for the KV-cache usage fraction.",
         deprecated=_ENGINE),
    Flag("lora-info-metric", "string", "Prometheus metric for the LoRA info metrics.", deprecated=_ENGINE),
    Flag("cache-info-metric", "string", "Prometheus metric for the cache info metrics.", deprecated=_ENGINE),
    Flag("model-server-metrics-scheme", "string", "Scheme to scrape metrics from endpoints (http or https).",
         deprecated=_DATALAYER),
    Flag("model-server-metrics-path", "string", "URL path to scrape metrics from endpoints.", deprecated=_DATALAYER),
    Flag("model-server-metrics-port", "int", "Port to scrape metrics from endpoints (with a single target port).",
         deprecated="This flag is deprecated and will be removed in a future release."),
    Flag("model-server-metrics-https-insecure-skip-verify", "bool",
         "Skip TLS verification when scraping metrics over https.", deprecated=_DATALAYER),
    Flag("v", "int", "Number for the log level verbosity (2 default, 3 verbose, 4 debug, 5 trace).", shorthand="v"),
    Flag("zap-devel", "bool",
         "Development mode defaults (encoder=console, stacktraces from warnings); production mode (false) "
         "defaults to encoder=json and stacktraces from errors."),
    Flag("zap-encoder", "string", "Zap log encoding: 'json' or 'console'."),
    Flag("zap-log-level", "string",
         "Zap level to configure the verbosity of logging: 'debug', 'info', 'error', 'panic' or an integer > 0 "
         "(as -v). Overrides -v."),
    Flag("zap-stacktrace-level", "string", "Zap level from which stacktraces are captured: info, error, panic."),
    Flag("zap-time-encoding", "string",
         "Zap time encoding: 'epoch', 'millis', 'nano', 'iso8601', 'rfc3339' or 'rfc3339nano'."),
    Flag("tracing", "bool", "Enables emitting OpenTelemetry traces (OTLP, configured by the OTEL_* environment)."),
    Flag("health-checking", "bool",
         "Enables the gRPC health service on the ext_proc port (service envoy.service.ext_proc.v3.ExternalProcessor)."),
    Flag("metrics-port", "int", "The metrics port exposed by EPP."),
    Flag("grpc-health-port", "int", "The port used for gRPC liveness and readiness probes."),
    Flag("enable-pprof", "bool", "Enables the profiling handlers under /debug/pprof/ on the metrics port."),
    Flag("cert-path", "string",
         "Directory with tls.crt and tls.key for secure serving; without it --secure-serving uses a self-signed "
         "certificate."),
    Flag("enable-cert-reload", "bool", "Reloads the certificate in --cert-path when its files change."),
    Flag("enable-grpc-stream-metrics", "bool",
         "Enables ext_proc gRPC stream metrics (in-flight gauge, hold-duration histogram, completions by code)."),
    Flag("secure-serving", "bool", "Enables TLS on the ext_proc port."),
    Flag("tls-min-version", "string", "Minimum TLS version for secure serving: VersionTLS12 or VersionTLS13."),
    Flag("tls-cipher-suites", "strings",
         "Comma-separated TLS 1.2 cipher suites for secure serving (Go crypto/tls names, e.g. "
         "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256). TLS 1.3 suites are not configurable."),
    Flag("metrics-endpoint-auth", "bool",
         "Requires a bearer token on the metrics port, authenticated (TokenReview) and authorized "
         "(SubjectAccessReview, get on the path) through the Kubernetes API."),
    Flag("metrics-client-ca-file", "string", "PEM CA for metrics mTLS: require verified client certs."),
    Flag("metrics-cert-dir", "string",
         "Directory with the metrics server's tls.crt and tls.key: enables TLS on the metrics endpoint."),
    Flag("config-file", "string", "The path to the configuration file."),
    Flag("config", "string", "Alias of --config-file.", dest="config_file"),
    Flag("config-text", "string", "The configuration specified as text, in lieu of a file."),
    Flag("allow-experimental-plugins", "bool", "Allows loading of experimental Alpha plugins."),
    Flag("bind-address", "string", "Address the ext_proc, health and metrics listeners bind (pyepp)."),
    Flag("max-request-body-bytes", "int", "Larger request bodies get a 413 (pyepp)."),
    Flag("max-inflight-body-bytes", "int",
         "Request body bytes all streams may hold at once; past it a request gets a 503 (pyepp)."),
    Flag("request-body-timeout", "duration",
         "A request body not complete this long after its headers gets a 408 in the API's error shape, and its "
         "stream ends (0: no limit) (pyepp)."),
    Flag("metrics-max-model-labels", "int",
         "Distinct model names (and fairness ids) that become metric labels; the rest count as __other__ (pyepp)."),
    Flag("endpoint-stale-after", "duration",
         "No good metrics scrape for this long: the endpoint is not routed to (0: never stale) (pyepp)."),
    Flag("endpoint-max-scrape-failures", "int",
         "Consecutive failed metrics scrapes after which the endpoint is not routed to (0: never) (pyepp)."),
    Flag("log-level", "string", "Python log level: debug, info, warning or error; overrides -v and --zap-log-level "
         "(pyepp)."),
    Flag("workers", "int", "EPP processes sharing the ports through SO_REUSEPORT (pyepp)."),
    Flag("event-loop", "string",
         "auto (default: uvloop when installed, else asyncio's), asyncio or uvloop: the loop the EPP serves on "
         "(pyepp)."),
    Flag("gil-switch-interval", "duration",
         "sys.setswitchinterval for the EPP process: how long a thread may hold the GIL while another waits for it "
         "(grpc's poller thread hands every message to the loop); 0 keeps Python's 5ms (pyepp)."),
    Flag("worker-index", "int", "internal: this worker's index", hidden=True),
    Flag("worker-state-socket", "string", "internal: the workers' relay (worker-state-syncer)", hidden=True),
    Flag("worker-feed", "string", "internal: the workers' feed of scrapes and KV events (worker 0 publishes)",
         hidden=True),
    Flag("kubeconfig", "string", "kubeconfig file (default: $KUBECONFIG, in-cluster, else ~/.kube/config) (pyepp)."),
    Flag("cross-replica-address", "string",
         "redis://, rediss://, valkey:// or unix:// URL of the Redis/Valkey the EPP replicas share in-flight load and "
         "speculative prefix entries through (a redis-cross-replica-syncer unless the config names its own; the Helm "
         "chart sets it when replicas > 1) (pyepp)."),
)  # fmt: skip


def _defaults() -> dict[str, Any]:
    base = Options()
    skip = {"changed", "warnings", "grpc_max_recv_bytes", "grpc_max_send_bytes"}
    return {f.name: getattr(base, f.name) for f in fields(Options) if f.name not in skip}


FLAGSET = FlagSet(FLAGS, _defaults())


def parse_options(argv: list[str]) -> Options:
    """Parse and validate `epp serve` flags; FlagError on any problem."""
    parsed: Parsed = FLAGSET.parse(argv)
    opts = Options(**parsed.values)
    opts.changed = parsed.changed
    opts.warnings = parsed.warnings
    opts.validate()
    return opts
