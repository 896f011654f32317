"""e2e.harness.external: an external EPP's spec, its placeholders and its environment."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from e2e.harness.external import (
    CONFIG_KEYS,
    check_spec,
    expand_env,
    file_discovery_yaml,
    fill,
    load_external,
    parse_external,
)
from e2e.harness.procs import REPO_ROOT, StartError


def test_fill_replaces_known_keys_and_leaves_yaml_braces() -> None:
    text = "a: {pluginRef: x}\nb: {blockSizeTokens: {block_size}}\nc: {model}\n"
    out = fill(text, {"block_size": 64, "model": "m"}, CONFIG_KEYS)
    assert out == "a: {pluginRef: x}\nb: {blockSizeTokens: 64}\nc: m\n"
    with pytest.raises(ValueError, match="render_url"):
        fill("{render_url}", {}, CONFIG_KEYS)


def test_expand_env_names_the_unset_variable() -> None:
    assert expand_env("${BIN} --x $OTHER", {"BIN": "/b", "OTHER": "y"}) == "/b --x y"
    with pytest.raises(ValueError, match="MY_EPP is not set"):
        expand_env("${MY_EPP} --config-file {config}", {})


def test_spec_errors_name_the_file_and_key(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("command: x\nconfig: y\ncomand: z\n")
    with pytest.raises(ValueError, match="unknown keys comand"):
        load_external("x", bad)
    bad.write_text("command: x\n")
    with pytest.raises(ValueError, match="config must be a non-empty string"):
        load_external("x", bad)
    with pytest.raises(ValueError, match=r"want name=spec\.yaml"):
        parse_external("nameonly")
    missing = tmp_path / "exe.yaml"
    missing.write_text("command: /no/such/epp --grpc-port {grpc_port}\nconfig: 'plugins: []'\n")
    with pytest.raises(StartError, match="not an executable"):
        check_spec(load_external("x", missing))


def test_shipped_specs_fill_to_valid_yaml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMD_EPP", "/bin/true")
    specs = parse_external(
        "d=e2e/external/llm-d-default.yaml,p=e2e/external/llm-d-precise.yaml,o=e2e/external/pyepp.yaml", REPO_ROOT
    )
    values = {k: "" for k in CONFIG_KEYS} | {
        "endpoints_file": "/tmp/e.yaml", "endpoints": "endpoints:\n- {name: a, address: 127.0.0.2, port: 1}",
        "block_size": 16, "prefill_tps": 666.7, "model": "Qwen/Qwen2.5-0.5B-Instruct", "render_url": "http://r:1",
        "kv_events": '{topicFilter: "kv@", discoverPods: true, podDiscoveryConfig: {socketPort: 5556}}',
    }  # fmt: skip
    precise = yaml.safe_load(specs["p"].config_text(values))
    by_type = {p["type"]: p for p in precise["plugins"]}
    assert by_type["file-discovery"]["parameters"]["path"] == "/tmp/e.yaml"
    assert by_type["token-producer"]["parameters"]["vllm"]["url"] == "http://r:1"
    producer = by_type["precise-prefix-cache-producer"]["parameters"]
    assert producer["tokenProcessorConfig"]["blockSizeTokens"] == 16
    assert producer["kvEventsConfig"]["podDiscoveryConfig"]["socketPort"] == 5556
    assert by_type["prefix-cache-affinity-filter"]["parameters"]["peakPrefillThroughput"] == 666.7
    default = yaml.safe_load(specs["d"].config_text(values))
    weights = {p["pluginRef"]: p.get("weight") for p in default["schedulingProfiles"][0]["plugins"]}
    assert weights == {"queue-scorer": 2, "kv-cache-utilization-scorer": 2, "prefix-cache-scorer": 3}
    ours = yaml.safe_load(specs["o"].config_text(values))
    assert ours["endpoints"][0]["address"] == "127.0.0.2"
    argv = specs["d"].argv({"config": "/c.yaml", "grpc_port": 1, "health_port": 2, "metrics_port": 3})
    assert argv[:3] == ["/bin/true", "--config-file", "/c.yaml"] and "--secure-serving=false" in argv
    for spec in specs.values():
        check_spec(spec)


def test_file_discovery_yaml_quotes_address_and_port() -> None:
    doc = yaml.safe_load(file_discovery_yaml([("sim-a", "127.0.0.2", 8000)]))
    assert doc == {"endpoints": [{"name": "sim-a", "address": "127.0.0.2", "port": "8000"}]}


def test_engine_spec_loads_and_fills(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from e2e.harness.engines import ENGINE_KEYS, load_engine

    monkeypatch.setenv("LLMD_SIM", "/bin/sim")
    spec = load_engine(REPO_ROOT / "e2e/external/llm-d-inference-sim.yaml")
    assert (spec.tokenizer, spec.cached_tokens, spec.events) == ("own", True, "connect")
    values = {k: 1 for k in ENGINE_KEYS} | {"events_endpoint": "tcp://127.0.0.1:9", "model": "m"}
    argv = fill(expand_env(spec.command), values, ENGINE_KEYS).split()
    assert (
        argv[0] == "/bin/sim"
        and "--zmq-endpoint" in argv
        and argv[argv.index("--zmq-endpoint") + 1] == ("tcp://127.0.0.1:9")
    )
    assert fill(spec.env["POD_NAME"], {"name": "p-0"}, ENGINE_KEYS) == "p-0"
    bad = tmp_path / "e.yaml"
    bad.write_text("command: x\ntokenizer: hf\n")
    with pytest.raises(ValueError, match="tokenizer must be own or qwen"):
        load_engine(bad)
