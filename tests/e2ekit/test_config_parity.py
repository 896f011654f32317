"""Config parity's pieces: the file-discovery plugin given to a config without Kubernetes, a binary's verdict from
its log and exit (stand-in executables), pyepp's from `epp validate`."""

from __future__ import annotations

from pathlib import Path

import yaml

from e2e.config_parity import DISCOVERY, STARTED, main, prepared, run_binary, run_ours


def test_a_config_gets_file_discovery_over_the_endpoints_file(tmp_path: Path) -> None:
    ep = tmp_path / "endpoints.yaml"
    doc = yaml.safe_load(prepared("plugins:\n- type: queue-scorer\n", ep))
    assert doc["plugins"][-1] == {"name": DISCOVERY, "type": "file-discovery", "parameters": {"path": str(ep)}}
    assert doc["dataLayer"] == {"discovery": {"pluginRef": DISCOVERY}}
    # a config with its own file-discovery plugin keeps it, reading the endpoints file here
    own = "plugins:\n- {name: fd, type: file-discovery, parameters: {path: /etc/epp/e.yaml, watchFile: true}}\n"
    doc = yaml.safe_load(prepared(own + "dataLayer: {discovery: {pluginRef: fd}}\n", ep))
    assert doc["plugins"] == [
        {"name": "fd", "type": "file-discovery", "parameters": {"path": str(ep), "watchFile": True}}
    ]
    assert doc["dataLayer"] == {"discovery": {"pluginRef": "fd"}}
    # so does the multi-cluster hub's file discovery (the same file format)
    hub = "plugins:\n- {name: d, type: multicluster-file-discovery, parameters: {path: /etc/epp/clusters/c.yaml}}\n"
    doc = yaml.safe_load(prepared(hub + "dataLayer: {discovery: {pluginRef: d}}\n", ep))
    assert doc["plugins"][0]["parameters"] == {"path": str(ep)} and len(doc["plugins"]) == 1
    # an empty config (the anchors' defaults) gets it too; text that is no mapping passes as it is
    assert yaml.safe_load(prepared("", ep))["dataLayer"]["discovery"]["pluginRef"] == DISCOVERY
    for text in ("plugins: [a, b", "- just\n- a list\n", "plugins: queue-scorer\n"):
        assert prepared(text, ep) == text


def _exe(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def test_the_binarys_verdict_from_its_log_and_exit(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("{}\n")
    ok = _exe(tmp_path / "ok", f'echo \'{{"level":"info","msg":"{STARTED}"}}\'\nexec sleep 30\n')
    assert run_binary(ok, cfg, tmp_path, timeout=10).accepted
    bad = _exe(
        tmp_path / "bad",
        'echo \'{"level":"error","msg":"Failed to parse configuration","error":"unknown parameter x"}\'\n'
        'echo \'{"level":"info","msg":"bye"}\'\nexit 1\n',
    )
    v = run_binary(bad, cfg, tmp_path, timeout=10)
    assert not v.accepted and v.reason == "Failed to parse configuration: unknown parameter x"
    stuck = _exe(tmp_path / "stuck", "exec sleep 30\n")
    v = run_binary(stuck, cfg, tmp_path, timeout=1)
    assert not v.accepted and "neither started nor exited" in v.reason
    # the same started line, then an exit within the moment after: rejected
    late = _exe(tmp_path / "late", f'echo \'{{"msg":"{STARTED}"}}\'\nsleep 0.3\nexit 3\n')
    assert not run_binary(late, cfg, tmp_path, timeout=10).accepted


def test_pyepps_verdict_is_epp_validates(tmp_path: Path) -> None:
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text("plugins:\n- type: queue-scorer\n")
    bad.write_text("plugins:\n- type: queue-scorer\n  parameters: {nope: 1}\n")
    assert run_ours(good).accepted
    v = run_ours(bad)
    assert not v.accepted and "queue-scorer: unknown parameter 'nope'" in v.reason


def test_the_cli_lists_the_configs_the_two_disagree_on(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.yaml").write_text("plugins:\n- type: queue-scorer\n")
    (corpus / "b.yaml").write_text("plugins:\n- type: queue-scorer\n  parameters: {nope: 1}\n")
    accepts_all = _exe(tmp_path / "all", f'echo \'{{"msg":"{STARTED}"}}\'\nexec sleep 30\n')
    out = tmp_path / "parity.md"
    assert main(["--binary", str(accepts_all), "--corpus", str(corpus), "--out", str(out)]) == 0
    text = out.read_text()
    assert "2 configs; both accept 1, both reject 0, differ 1" in text
    assert "| b.yaml | accepts | rejects: " in text and "| a.yaml |" not in text
    assert main(["--binary", str(tmp_path / "missing"), "--corpus", str(corpus)]) == 2
