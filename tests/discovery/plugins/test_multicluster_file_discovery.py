"""multicluster-file-discovery: clusters by hostname or IP, their metrics host from the metricsAddress/metricsPort
labels, on the first load and on a reload."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from epp.datalayer.datastore import Datastore
from epp.discovery.plugins import file_discovery
from epp.discovery.plugins.multicluster_file_discovery import MultiClusterFileDiscovery, host_or_ip
from tests.helpers import build

CLUSTERS = """endpoints:
  - {name: a, address: gw.cluster-a.example.com, port: "443"}
  - {name: b, address: "10.0.0.2", port: "80", labels: {metricsAddress: "10.0.9.2", metricsPort: "9090"}}
  - {name: c, address: "fd00::3", port: "80", labels: {metricsAddress: epp.c.svc}}
  - {name: d, address: "Not_A_Host!", port: "80"}
"""


def test_host_or_ip() -> None:
    assert [host_or_ip(a) for a in ("10.0.0.1", "::1", "gw.example.com", "a-b.c")] == [None] * 4
    assert all(host_or_ip(a) for a in ("UPPER.example.com", "a_b", "-x.com", "x" * 254, ""))


def test_clusters_and_their_metrics_hosts(tmp_path: Path) -> None:
    f = tmp_path / "clusters.yaml"
    f.write_text(CLUSTERS)
    disc = build(MultiClusterFileDiscovery, {"path": str(f)})
    eps = {e.name: e for e in disc.load()}
    assert sorted(eps) == ["a", "b", "c"]  # d skipped
    assert (eps["a"].hostport, eps["a"].metrics_hostport) == ("gw.cluster-a.example.com:443",) * 2
    assert (eps["b"].hostport, eps["b"].metrics_hostport) == ("10.0.0.2:80", "10.0.9.2:9090")
    assert (eps["c"].hostport, eps["c"].metrics_hostport) == ("[fd00::3]:80", "epp.c.svc:80")  # port: the endpoint's
    # the stock file-discovery keeps to IPv4 pod addresses
    assert [e.name for e in file_discovery.parse_endpoints(CLUSTERS, "f")] == ["b"]


async def test_a_reload_keeps_the_metrics_hosts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(file_discovery, "POLL_SECONDS", 0.02)
    f = tmp_path / "clusters.yaml"
    f.write_text("endpoints: [{name: a, address: 10.0.0.1, port: 80}]\n")
    ds = Datastore()
    task = asyncio.create_task(build(MultiClusterFileDiscovery, {"path": str(f), "watchFile": True}).run(ds))
    try:
        for _ in range(100):
            if ds.endpoints():
                break
            await asyncio.sleep(0.02)
        f.write_text(CLUSTERS)
        for _ in range(200):
            if len(ds.endpoints()) == 3:
                break
            await asyncio.sleep(0.02)
        assert {e.name: e.metrics_hostport for e in ds.endpoints()}["b"] == "10.0.9.2:9090"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
