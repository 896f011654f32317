"""`epp serve` flags: Go/pflag syntax, the anchors' names and defaults, and their validation rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from epp.cli import main
from epp.server.goflags import FlagError, parse_duration, parse_int, parse_quantity_bytes
from epp.server.options import FLAGSET, Options, parse_options

# Every flag llm-d-router v0.10.0 registers for cmd/epp, with its default, transcribed from
# llm-d/llm-d-router@71f4f0999f95b96c49a9d0c4afbd18dfdb943c26 pkg/epp/server/options.go (NewOptions, AddFlags)
# and pkg/common/observability/logging/options.go (-v DEFAULT=2, zap Development=true).
LLMD_V010_DEFAULTS: dict[str, object] = {
    "grpc-port": 9002, "ha-enable-leader-election": False, "drain-timeout": 30.0, "grpc-max-recv-msg-size": "",
    "grpc-max-send-msg-size": "", "pool-group": "inference.networking.k8s.io", "pool-namespace": "",
    "pool-name": "", "endpoint-selector": "", "endpoint-target-ports": [], "disable-endpoint-subset-filter": False,
    "emit-endpoint-scores": False, "refresh-metrics-interval": 0.05, "refresh-prometheus-metrics-interval": 5.0,
    "metrics-staleness-threshold": 2.0, "total-queued-requests-metric": "vllm:num_requests_waiting",
    "total-running-requests-metric": "vllm:num_requests_running",
    "kv-cache-usage-percentage-metric": "vllm:kv_cache_usage_perc", "lora-info-metric": "vllm:lora_requests_info",
    "cache-info-metric": "vllm:cache_config_info", "v": 2, "zap-devel": True, "zap-encoder": "",
    "zap-log-level": "", "zap-stacktrace-level": "", "zap-time-encoding": "", "tracing": True,
    "health-checking": False, "metrics-port": 9090, "grpc-health-port": 9003, "enable-pprof": True,
    "cert-path": "", "enable-cert-reload": False, "enable-grpc-stream-metrics": False, "secure-serving": True,
    "tls-min-version": "", "tls-cipher-suites": [], "metrics-endpoint-auth": True, "metrics-client-ca-file": "",
    "metrics-cert-dir": "", "config-file": "", "config-text": "", "allow-experimental-plugins": False,
}  # fmt: skip
# GIE v1.5.0 (kubernetes-sigs/gateway-api-inference-extension@df9f8909fe06fe2dfd4a6fc0bd0c01a0acabf849,
# pkg/epp/server/options.go) adds these, deprecated there but in effect.
GIE_V15_EXTRA_DEFAULTS: dict[str, object] = {
    "model-server-metrics-scheme": "http",
    "model-server-metrics-path": "/metrics",
    "model-server-metrics-port": 0,
    "model-server-metrics-https-insecure-skip-verify": True,
}


def test_every_anchor_flag_exists_with_the_anchor_default() -> None:
    for name, default in {**LLMD_V010_DEFAULTS, **GIE_V15_EXTRA_DEFAULTS}.items():
        flag = FLAGSET.by_name.get(name)
        assert flag is not None, name
        assert FLAGSET.defaults[flag.attr] == default, name
    assert FLAGSET.by_short["v"].name == "v"


@pytest.mark.parametrize(
    "argv",
    [
        ["--grpc-port=9100"],
        ["--grpc-port", "9100"],
        ["-grpc-port=9100"],
        ["-grpc-port", "9100"],
        ["--grpc-port=0x238c"],
    ],
)
def test_value_syntaxes(argv: list[str]) -> None:
    opts = parse_options(argv)
    assert opts.grpc_port == 9100 and opts.given("grpc-port")


def test_booleans_as_pflag() -> None:
    assert parse_options([]).secure_serving is True
    assert parse_options(["--secure-serving=false"]).secure_serving is False
    assert parse_options(["--secure-serving=False"]).secure_serving is False
    assert parse_options(["--secure-serving=0"]).secure_serving is False
    assert parse_options(["--secure-serving=false", "--secure-serving"]).secure_serving is True  # last wins
    assert parse_options(["--ha-enable-leader-election"]).ha_enable_leader_election is True
    assert parse_options(["--tracing=t"]).tracing is True
    with pytest.raises(FlagError, match=r"--secure-serving=false"):
        parse_options(["--secure-serving", "false"])  # pflag: a bool never consumes the next word
    with pytest.raises(FlagError, match='invalid argument "yes" for "--tracing" flag'):
        parse_options(["--tracing=yes"])


def test_verbosity_shorthand_forms() -> None:
    for argv in (["-v", "4"], ["-v=4"], ["-v4"], ["--v=4"], ["--v", "4"]):
        assert parse_options(argv).v == 4, argv
    assert parse_options(["--v=-3"]).v == 2  # the anchor resets a negative -v to DEFAULT


def test_durations_as_go() -> None:
    assert parse_duration("30s") == 30.0
    assert parse_duration("1m30s") == 90.0
    assert parse_duration("1.5h") == 5400.0
    assert parse_duration("300ms") == pytest.approx(0.3)
    assert parse_duration("2us") == pytest.approx(2e-6)
    assert parse_duration("0") == 0.0
    assert parse_duration("-2s") == -2.0
    for bad in ("30", "s", "1x", "", "1m30", ".s"):
        with pytest.raises(ValueError):
            parse_duration(bad)
    assert parse_options(["--drain-timeout=1m30s"]).drain_timeout == 90.0
    assert parse_options(["--refresh-metrics-interval", "100ms"]).refresh_metrics_interval == pytest.approx(0.1)
    with pytest.raises(FlagError, match=r'invalid argument "30" for "--drain-timeout" flag: missing unit'):
        parse_options(["--drain-timeout=30"])


def test_ints_as_go() -> None:
    assert parse_int("0x10") == 16
    assert parse_int("010") == 8
    assert parse_int("1_000") == 1000
    for bad in ("1.5", "", " 1", "abc", "9223372036854775808"):
        with pytest.raises(ValueError):
            parse_int(bad)


def test_slices_replace_the_default_then_append() -> None:
    opts = parse_options(
        ["--endpoint-selector=app=x", "--endpoint-target-ports=8000,8001", "--endpoint-target-ports=8002"]
    )
    assert opts.endpoint_target_ports == [8000, 8001, 8002]
    opts = parse_options(["--endpoint-target-ports=8000,8000,8001"])
    assert opts.endpoint_target_ports == [8000, 8001]  # removeDuplicatePorts
    suites = parse_options(["--tls-cipher-suites=TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,TLS_AES_128_GCM_SHA256"])
    assert suites.tls_cipher_suites == ["TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", "TLS_AES_128_GCM_SHA256"]


def test_message_sizes_as_kubernetes_quantities() -> None:
    assert parse_quantity_bytes("10MiB") == 10 * 2**20
    assert parse_quantity_bytes("10Mi") == 10 * 2**20
    assert parse_quantity_bytes("25MB") == 25_000_000
    assert parse_quantity_bytes("4194304") == 4194304
    assert parse_quantity_bytes("1.5Ki") == 1536
    assert parse_quantity_bytes("1e3") == 1000
    opts = parse_options(["--grpc-max-recv-msg-size=10MiB", "--grpc-max-send-msg-size=25MB"])
    assert (opts.grpc_max_recv_bytes, opts.grpc_max_send_bytes) == (10 * 2**20, 25_000_000)
    with pytest.raises(FlagError, match="invalid grpc-max-recv-msg-size"):
        parse_options(["--grpc-max-recv-msg-size=ten"])
    with pytest.raises(FlagError, match="32-bit"):
        parse_options(["--grpc-max-send-msg-size=4Gi"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--no-such-flag=1"], "unknown flag: --no-such-flag"),
        (["-x"], "unknown flag: -x"),
        (["--grpc-port"], "flag needs an argument: --grpc-port"),
        (["positional"], "unexpected argument 'positional'"),
        (["--lora-info-metric=foo"], 'flag "lora-info-metric" is deprecated and cannot be used'),
        (["--cache-info-metric", "x"], 'flag "cache-info-metric" is deprecated and cannot be used'),
        (["--config-file=a", "--config-text=b"], '"config-file" and "config-text" flags cannot be set'),
        (["--tls-min-version=TLS13"], "unknown TLS version"),
        (["--tls-min-version=VersionTLS11"], "never negotiates below TLS 1.2"),
        (["--tls-cipher-suites=TLS_FOO"], 'unknown cipher suite "TLS_FOO"'),
        (["--tls-cipher-suites=TLS_RSA_WITH_RC4_128_SHA"], "not available in gRPC's TLS stack"),
        (["--metrics-client-ca-file=/nonexistent"], "metrics TLS cert file unreadable"),
        (["--model-server-metrics-scheme=ftp"], "it can only be set to 'http' or 'https'"),
        (["--zap-encoder=xml"], "want one of json, console"),
        (["--zap-log-level=loud"], "--zap-log-level"),
        (["--zap-time-encoding=unix"], "--zap-time-encoding"),
        (["--grpc-port=70000"], "out of range"),
    ],
)
def test_rejections(argv: list[str], message: str) -> None:
    with pytest.raises(FlagError, match=message.replace("(", r"\(").replace(".", r"\.")):
        parse_options(argv)


def test_metrics_tls_rules(tmp_path: Path) -> None:
    (tmp_path / "tls.crt").write_text("x")
    (tmp_path / "tls.key").write_text("x")
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    with pytest.raises(FlagError, match='"metrics-client-ca-file" requires "metrics-cert-dir"'):
        parse_options([f"--metrics-client-ca-file={ca}"])
    with pytest.raises(FlagError, match="enables metrics TLS without authentication"):
        parse_options([f"--metrics-cert-dir={tmp_path}", "--metrics-endpoint-auth=false"])
    parse_options([f"--metrics-cert-dir={tmp_path}", f"--metrics-client-ca-file={ca}", "--metrics-endpoint-auth=false"])
    with pytest.raises(FlagError, match="metrics TLS cert file unreadable"):
        parse_options([f"--metrics-cert-dir={tmp_path / 'missing'}"])


def test_deprecated_flags_warn_and_take_effect() -> None:
    opts = parse_options(["--model-server-metrics-path=/custom", "--model-server-metrics-port=9100"])
    assert opts.model_server_metrics_path == "/custom" and opts.model_server_metrics_port == 9100
    assert any("--model-server-metrics-path has been deprecated" in w for w in opts.warnings)


def test_cli_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--secure-serving", "false"]) == 2
    assert "--secure-serving=false" in capsys.readouterr().err
    assert main(["--bogus"]) == 2  # flags first, no subcommand: `epp serve`, as the Go binary
    assert "unknown flag: --bogus" in capsys.readouterr().err
    assert main(["serve", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--ha-enable-leader-election" in out and "--zap-encoder string" in out and "-v, --v int" in out


def test_options_defaults_equal_the_flag_defaults() -> None:
    assert Options() == Options(**FLAGSET.defaults)


@pytest.mark.parametrize("given", ['"/custom"', "'/custom'"])
def test_quoted_metrics_path_loses_its_quotes_loudly(given: str) -> None:
    opts = parse_options([f"--model-server-metrics-path={given}"])
    assert opts.model_server_metrics_path == "/custom"
    assert any("the quotes are not part of the path" in w and "'/custom'" in w for w in opts.warnings)
    plain = parse_options(['--model-server-metrics-path=/a"b'])
    assert plain.model_server_metrics_path == '/a"b'
    assert not any("quotes" in w for w in plain.warnings)
