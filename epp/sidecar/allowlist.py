"""SSRF protection: the prefillers a decode pod's sidecar may send prompts to.

With `--enable-ssrf-protection`, a prefiller is allowed only if its host (IP or pod name) belongs to a pod of the
InferencePool that can prefill (`llm-d.ai/role` prefill, encode-prefill, prefill-decode, both or
encode-prefill-decode; llm-d allows any pod of the pool), watched with the EPP's own Kubernetes discovery, or is in
`--allowed-prefillers`. Encoders (`x-encoder-hosts-ports`) likewise must be encode-capable pods of the pool
(`encode`, `encode-prefill`, `encode-prefill-decode`) or fixed hosts. Without it every host passes (llm-d's default).
"""

from __future__ import annotations

import logging

from epp.datalayer.datastore import Datastore
from epp.discovery.kubernetes import KubernetesDiscoveryConfig, KubernetesEndpointSource

log = logging.getLogger(__name__)

ROLE_LABEL = "llm-d.ai/role"
PREFILL_ROLES = frozenset({"prefill", "encode-prefill", "prefill-decode", "both", "encode-prefill-decode"})
ENCODE_ROLES = frozenset({"encode", "encode-prefill", "encode-prefill-decode"})


def split_host(hostport: str) -> str:
    """`host` of `host:port` / `[v6]:port` (a bare host is returned as is)."""
    if hostport.startswith("["):
        return hostport[1 : hostport.find("]")] if "]" in hostport else hostport
    return hostport.rsplit(":", 1)[0] if hostport.count(":") == 1 else hostport


class Allowlist:
    def __init__(self, enabled: bool, fixed: list[str] | None = None, datastore: Datastore | None = None) -> None:
        self.enabled = enabled
        self.fixed = {split_host(h) for h in fixed or []}
        self.datastore = datastore

    def allowed(self, hostport: str, roles: frozenset[str] = PREFILL_ROLES) -> bool:
        if not self.enabled:
            return True
        host = split_host(hostport)
        if host in self.fixed:
            return True
        if self.datastore is None:
            return False
        for ep in self.datastore.endpoints():
            if ep.labels.get(ROLE_LABEL) in roles and host in (ep.address, ep.pod_name):
                return True
        return False


def pool_source(namespace: str, name: str, group: str, kubeconfig: str | None) -> KubernetesEndpointSource:
    cfg = KubernetesDiscoveryConfig(
        namespace=namespace, pool_name=name, pool_group=group, kubeconfig=kubeconfig, watch_objectives=False
    )
    return KubernetesEndpointSource(cfg)
