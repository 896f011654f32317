"""multicluster-file-discovery (llm-d-router, Alpha): a multi-cluster hub's endpoints are whole clusters, read from a
file in file-discovery's format (`path`, `watchFile`).

A cluster is reached through its gateway, so its `address` may be a hostname (a DNS-1123 subdomain) as well as an
IPv4 or IPv6 address. Its labels `metricsAddress` (and `metricsPort`, else the endpoint's port) say where its EPP's
/metrics is when that is not at the gateway's address: the metrics sources scrape there.
"""

from __future__ import annotations

import ipaddress
import logging
import re

from epp.discovery.plugins.file_discovery import FileDiscovery
from epp.framework import Endpoint, Stability

log = logging.getLogger(__name__)

# Kubernetes' IsDNS1123Subdomain: at most 253 characters of dot-separated lowercase labels.
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def host_or_ip(address: str) -> str | None:
    """llm-d-router's validateHostOrIP: an IP literal (v4 or v6) or a DNS-1123 subdomain; the reason if not."""
    try:
        ipaddress.ip_address(address)
        return None
    except ValueError:
        pass
    if len(address) <= 253 and _DNS1123_SUBDOMAIN.match(address):
        return None
    return "is not a host name or an IP address"


class MultiClusterFileDiscovery(FileDiscovery):
    type_name = "multicluster-file-discovery"
    stability = Stability.ALPHA

    @staticmethod
    def check_address(address: str) -> str | None:
        return host_or_ip(address)

    def load(self) -> list[Endpoint]:
        endpoints = super().load()
        for ep in endpoints:
            metrics_host_from_labels(ep, self.path)
        return endpoints


def metrics_host_from_labels(ep: Endpoint, source: str) -> None:
    """`metricsAddress` / `metricsPort` labels: where this cluster's metrics are (without them: the endpoint)."""
    addr = ep.labels.get("metricsAddress", "")
    if not addr:
        return
    port = ep.labels.get("metricsPort", "") or str(ep.port)
    try:
        p = int(port)
    except ValueError:
        p = 0
    if not 1 <= p <= 65535:
        log.warning("%s: endpoint %r: label metricsPort %r is not in 1-65535: ignored", source, ep.name, port)
        p = ep.port
    ep.metrics_address = addr
    ep.metrics_port = p
