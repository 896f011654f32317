"""The routing sidecar's flags (llm-d pd-sidecar spelling), YAML configuration and SSRF allowlist."""

from __future__ import annotations

from pathlib import Path

import pytest

from epp.datalayer.datastore import Datastore
from epp.framework import Endpoint
from epp.sidecar.__main__ import main
from epp.sidecar.allowlist import Allowlist, split_host
from epp.sidecar.options import OptionsError, parse


def test_defaults_match_llm_d() -> None:
    c, verbosity = parse([])
    assert (c.port, c.model_server_port, c.kv_connector, c.secure_proxy) == (8000, 8200, "nixlv2", True)
    assert (c.prefill_max_retries, c.prefill_retry_backoff, c.enable_ssrf_protection) == (0, 0.2, False)
    assert verbosity == 1


def test_flags_pflag_style() -> None:
    c, _ = parse([
        "--port=9000", "--vllm-port", "8300", "--kv-connector", "shared-storage", "--secure-proxy=false",
        "--enable-ssrf-protection", "--inference-pool", "ns1/pool-a", "--prefill-max-retries", "2",
        "--prefill-retry-backoff", "50ms", "--enable-tls", "prefiller", "--enable-tls=decoder",
        "--tls-insecure-skip-verify", "prefiller,decoder",
    ])  # fmt: skip
    assert (c.port, c.model_server_port, c.kv_connector, c.secure_proxy) == (9000, 8300, "shared-storage", False)
    assert (c.inference_pool_namespace, c.inference_pool_name) == ("ns1", "pool-a")
    assert (c.prefill_max_retries, c.prefill_retry_backoff) == (2, 0.05)
    assert c.tls_prefiller and c.tls_decoder and c.insecure_prefiller and c.insecure_decoder
    assert c.prefiller_scheme == "https"
    c2, _ = parse(["--inference-pool", "pool-b", "--enable-ssrf-protection=true"])
    assert (c2.inference_pool_namespace, c2.inference_pool_name) == ("default", "pool-b")


def test_yaml_configuration_and_flag_precedence(tmp_path: Path) -> None:
    c, _ = parse(["--configuration", "{port: 8085, model-server-port: 8203, prefill-max-retries: 3}", "--port", "1"])
    assert (c.port, c.model_server_port, c.prefill_max_retries) == (1, 8203, 3)
    f = tmp_path / "sidecar.yaml"
    f.write_text("kv-connector: shared-storage\nsecure-proxy: false\n")
    c, _ = parse(["--configuration-file", str(f)])
    assert c.kv_connector == "shared-storage" and not c.secure_proxy


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--kv-connector", "foo"], "unknown 'foo'"),
        (["--kv-connector", "mooncake"], "not supported by this sidecar (vLLM's MooncakeConnector"),
        (["--kv-connector", "sglang"], "not supported by this sidecar (SGLang's bootstrap protocol"),
        (["--kv-connector", "offloading"], "not supported by this sidecar (vLLM's OffloadingConnector"),
        (["--enable-ssrf-protection"], "needs --inference-pool"),
        (["--enable-tls", "nobody"], "stages must be one of"),
        (["--prefill-retry-backoff", "soon"], "--prefill-retry-backoff"),
        (["--decode-chunk-size", "256"], "chunked decode"),
        (["--ec-connector", "nixl"], "unknown 'nixl'; supported: ec-example, ec-nixl"),
        (["--configuration", "{nope: 1}"], "unknown key(s) nope"),
        (["--configuration", "{}", "--configuration-file", "x"], "mutually exclusive"),
    ],
)
def test_bad_flags_are_clear_errors(argv: list[str], message: str) -> None:
    with pytest.raises(OptionsError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse(argv)


def test_encoder_stage_flags() -> None:
    c, _ = parse(["--ec-connector", "ec-nixl", "--enable-tls", "encoder", "--tls-insecure-skip-verify=encoder"])
    assert c.ec_connector == "ec-nixl" and c.encoder_scheme == "https" and c.insecure_encoder
    assert not c.tls_prefiller and c.prefiller_scheme == "http"
    c, _ = parse(["--configuration", "{ec-connector: ec-example}"])
    assert c.ec_connector == "ec-example" and c.encoder_scheme == "http"
    assert parse([])[0].ec_connector == ""  # no encoder stage by default (llm-d's default)


def test_main_exits_2_with_the_message(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--kv-connector", "foo"]) == 2
    assert "epp-pd-sidecar: --kv-connector: unknown 'foo'" in capsys.readouterr().err


def test_allowlist_only_prefillers_of_the_pool() -> None:
    ds = Datastore()
    ds.replace_all([
        Endpoint("p-0", "10.0.0.1", 8000, labels={"llm-d.ai/role": "prefill"}, pod_name="prefill-pod-0"),
        Endpoint("d-0", "10.0.0.2", 8000, labels={"llm-d.ai/role": "decode"}),
        Endpoint("b-0", "10.0.0.3", 8000, labels={"llm-d.ai/role": "both"}),
    ])  # fmt: skip
    a = Allowlist(True, ["192.168.1.9"], ds)
    assert a.allowed("10.0.0.1:8000") and a.allowed("10.0.0.1:9999") and a.allowed("prefill-pod-0:8000")
    assert a.allowed("10.0.0.3:8000") and a.allowed("192.168.1.9:1")
    assert not a.allowed("10.0.0.2:8000")  # a decode pod is not a prefiller
    assert not a.allowed("169.254.169.254:80")
    assert Allowlist(False).allowed("169.254.169.254:80")
    assert split_host("[fd00::1]:8000") == "fd00::1" and split_host("h:1") == "h"


def test_console_script_and_module_entry_point() -> None:
    import importlib
    import tomllib

    scripts = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, attr = scripts["epp-pd-sidecar"].partition(":")
    assert getattr(importlib.import_module(module), attr) is main
