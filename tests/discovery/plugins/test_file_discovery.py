"""file-discovery: endpoints from a file, bad entries skipped, a bad file stops startup, changes followed."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from epp.datalayer.datastore import Datastore
from epp.discovery.plugins import file_discovery
from epp.discovery.plugins.file_discovery import FileDiscovery, FileDiscoveryError, parse_endpoints
from epp.framework import PluginConfigError
from tests.helpers import build

GOOD = """endpoints:
  - name: vllm-0
    address: "10.0.0.1"
    port: "8000"
    labels: {role: decode}
  - name: bad-ip
    address: "not-an-ip"
    port: "8000"
  - name: bad-port
    address: "10.0.0.3"
    port: "70000"
  - name: vllm-1
    namespace: ns
    address: "10.0.0.2"
    port: 8001
"""


def test_entries_are_validated_and_bad_ones_skipped() -> None:
    eps = parse_endpoints(GOOD, "f.yaml")
    assert [(e.name, e.hostport, e.namespace, e.labels) for e in eps] == [
        ("vllm-0", "10.0.0.1:8000", "default", {"role": "decode"}),
        ("vllm-1", "10.0.0.2:8001", "ns", {}),
    ]
    with pytest.raises(FileDiscoveryError, match="expected a mapping with an 'endpoints' list"):
        parse_endpoints("endpoints: 3\n", "f.yaml")


def test_path_is_required() -> None:
    with pytest.raises(PluginConfigError, match="'path': required"):
        build(FileDiscovery, {"watchFile": True})


async def test_a_missing_file_stops_startup(tmp_path: Path) -> None:
    plugin = build(FileDiscovery, {"path": str(tmp_path / "none.yaml")})
    with pytest.raises(FileDiscoveryError, match="cannot read the endpoints file"):
        await plugin.run(Datastore())


async def test_watch_follows_changes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(file_discovery, "POLL_SECONDS", 0.02)
    path = tmp_path / "endpoints.yaml"
    path.write_text(GOOD)
    ds = Datastore()
    task = asyncio.create_task(build(FileDiscovery, {"path": str(path), "watchFile": True}).run(ds))
    for _ in range(100):
        if ds.synced:
            break
        await asyncio.sleep(0.01)
    assert sorted(e.name for e in ds.endpoints()) == ["vllm-0", "vllm-1"]
    path.write_text('endpoints:\n- {name: vllm-2, address: "10.0.0.9", port: "9000"}\n')
    for _ in range(200):
        if [e.name for e in ds.endpoints()] == ["vllm-2"]:
            break
        await asyncio.sleep(0.01)
    assert [e.hostport for e in ds.endpoints()] == ["10.0.0.9:9000"]
    path.write_text("endpoints: [")  # a broken reload keeps the current endpoints
    await asyncio.sleep(0.1)
    assert [e.name for e in ds.endpoints()] == ["vllm-2"]
    task.cancel()
