"""Pods → endpoints with GIE's rules: ready, not terminating, one endpoint per active targetPort (`<pod>-rank-<i>`)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

from epp.datalayer.datastore import Datastore
from epp.framework.types import Endpoint

log = logging.getLogger(__name__)

ACTIVE_PORTS_ANNOTATION = "inference.networking.k8s.io/active-ports"


def is_pod_ready(pod: dict[str, Any]) -> bool:
    """Not being deleted, and the Ready condition (which already folds in readiness gates) is True."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if isinstance(cond, dict) and cond.get("type") == "Ready":
            return cond.get("status") == "True"
    return False


def active_ports(pod: dict[str, Any]) -> set[int] | None:
    """The ports named by the active-ports annotation, or None when it is absent or blank (all ports active)."""
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(ACTIVE_PORTS_ANNOTATION)
    if raw is None or not str(raw).strip():
        return None
    ports: set[int] = set()
    for part in str(raw).split(","):
        try:
            ports.add(int(part.strip()))
        except ValueError:
            log.warning("pod %s: ignoring bad %s entry %r", _name(pod), ACTIVE_PORTS_ANNOTATION, part)
    return ports


def _name(pod: dict[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("name", ""))


def pod_endpoints(pod: dict[str, Any], target_ports: Sequence[int], metrics_port: int | None = None) -> list[Endpoint]:
    """The endpoints a pod contributes right now (none when it is not ready or has no IP).

    The rank index is the port's position in the pool's targetPorts, so names stay stable when the
    active-ports annotation turns ranks on and off.
    """
    if not is_pod_ready(pod):
        return []
    ip = (pod.get("status") or {}).get("podIP")
    if not ip:
        return []
    meta = pod.get("metadata") or {}
    name, namespace = _name(pod), str(meta.get("namespace") or "default")
    labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    active = active_ports(pod)
    own_metrics_port = metrics_port if metrics_port and len(target_ports) == 1 else None
    return [
        Endpoint(
            name=f"{name}-rank-{i}",
            address=str(ip),
            port=port,
            namespace=namespace,
            labels=dict(labels),
            metrics_port=own_metrics_port,
            pod_name=name,
            node_address=str((pod.get("status") or {}).get("hostIP") or ""),
        )
        for i, port in enumerate(target_ports)
        if active is None or port in active
    ]


class PodEndpoints:
    """Mirrors a set of pods into the datastore; remembers which endpoints each pod owns so removal is exact."""

    def __init__(self, datastore: Datastore, target_ports: Sequence[int], metrics_port: int | None = None) -> None:
        self.datastore = datastore
        self.target_ports = list(target_ports)
        self.metrics_port = metrics_port
        self._owned: dict[str, set[str]] = {}  # pod name -> endpoint names

    def replace(self, pods: Iterable[dict[str, Any]]) -> None:
        """Make the datastore hold exactly these pods' endpoints (after a full list)."""
        wanted: dict[str, list[Endpoint]] = {
            _name(p): pod_endpoints(p, self.target_ports, self.metrics_port) for p in pods
        }
        for pod_name in list(self._owned):
            if pod_name not in wanted:
                self._drop(pod_name)
        for pod_name, eps in wanted.items():
            self._set(pod_name, eps)

    def upsert(self, pod: dict[str, Any]) -> None:
        self._set(_name(pod), pod_endpoints(pod, self.target_ports, self.metrics_port))

    def delete(self, pod: dict[str, Any]) -> None:
        self._drop(_name(pod))

    def clear(self) -> None:
        for pod_name in list(self._owned):
            self._drop(pod_name)

    @property
    def pod_count(self) -> int:
        return len(self._owned)

    def _set(self, pod_name: str, endpoints: list[Endpoint]) -> None:
        new = {ep.name for ep in endpoints}
        for stale in self._owned.get(pod_name, set()) - new:
            self.datastore.remove(stale)
        for ep in endpoints:
            self.datastore.upsert(ep)
        if new:
            self._owned[pod_name] = new
        else:
            self._owned.pop(pod_name, None)

    def _drop(self, pod_name: str) -> None:
        for ep_name in self._owned.pop(pod_name, set()):
            self.datastore.remove(ep_name)
