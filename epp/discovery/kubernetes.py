"""Discovery from Kubernetes: one InferencePool (or a bare label selector) and the ready pods it selects.

Pool mode watches `inferencepools` by name; its `spec.selector.matchLabels` and `spec.targetPorts` decide which
pods to watch and which ports become endpoints. A selector change restarts the pod watch (a full re-list that
drops pods no longer selected); a targetPorts change recomputes endpoints from the cached pods; deleting the pool
clears the datastore. Standalone mode (`--endpoint-selector` + `--endpoint-target-ports`) watches pods only.
Removing an endpoint from the datastore is all this module does on pod loss: scrapers and KV-event subscribers
follow the datastore's listener notifications.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubernetes_asyncio import client

from epp.datalayer.datastore import Datastore
from epp.datalayer.objectives import ObjectiveStore
from epp.discovery.informer import INFERENCE_OBJECTIVES, INFERENCE_POOLS, PODS, Backoff, Informer, ResourceKind
from epp.discovery.kubeclient import api_client
from epp.discovery.objectives import DEFAULT_POOL_GROUP, ObjectiveHandler
from epp.discovery.pods import PodEndpoints
from epp.framework.verbosity import DEFAULT, V

log = logging.getLogger(__name__)

MAX_TARGET_PORTS = 8


class KubernetesArgsError(ValueError):
    """Inconsistent discovery flags."""


@dataclass
class KubernetesDiscoveryConfig:
    namespace: str = "default"
    pool_name: str | None = None
    pool_group: str = DEFAULT_POOL_GROUP
    endpoint_selector: dict[str, str] | None = None  # standalone mode (equality selector)
    # standalone mode with a set-based / existence selector (`env in (a,b),!canary`), sent to the API as is
    endpoint_selector_expr: str | None = None
    target_ports: list[int] = field(default_factory=list)  # standalone mode
    model_server_metrics_port: int | None = None
    kubeconfig: str | None = None
    watch_objectives: bool = True
    watch_timeout: float = 300.0

    def __post_init__(self) -> None:
        standalone = bool(self.endpoint_selector) or bool(self.endpoint_selector_expr)
        if bool(self.pool_name) == standalone:
            raise KubernetesArgsError("exactly one of --pool-name and --endpoint-selector must be set")
        if standalone:
            if not 1 <= len(self.target_ports) <= MAX_TARGET_PORTS:
                raise KubernetesArgsError(f"--endpoint-target-ports needs 1 to {MAX_TARGET_PORTS} ports")
            _check_ports(self.target_ports, "--endpoint-target-ports")


def _check_ports(ports: Sequence[int], where: str) -> None:
    for p in ports:
        if not 0 < p < 65536:
            raise KubernetesArgsError(f"{where}: port {p} is out of range")
    if len(set(ports)) != len(ports):
        raise KubernetesArgsError(f"{where}: ports must be unique, got {list(ports)}")


def selector_string(match_labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(match_labels.items()))


_LABEL_KEY = re.compile(
    r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
)
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")
_SET_REQ = re.compile(r"\s*(\S+?)\s+(in|notin)\s*\((.*)\)\s*")


def _split_requirements(text: str) -> list[str]:
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return parts


def label_selector(text: str) -> tuple[dict[str, str] | None, str]:
    """Kubernetes label selector syntax (labels.Parse, as llm-d-router v0.10's --endpoint-selector): equality
    (`k=v`, `k==v`, `k!=v`), set-based (`k in (a,b)`, `k notin (a)`) and existence (`k`, `!k`). Returns the equality
    selector as a dict when that is all it is, else None, plus the normalized selector string."""
    reqs: list[str] = []
    equal: dict[str, str] = {}
    only_equality = True

    def key_ok(key: str) -> str:
        if not _LABEL_KEY.fullmatch(key) or len(key.rpartition("/")[2]) > 63:
            raise KubernetesArgsError(f"--endpoint-selector: invalid label key {key!r}")
        return key

    def value_ok(value: str) -> str:
        if not _LABEL_VALUE.fullmatch(value) or len(value) > 63:
            raise KubernetesArgsError(f"--endpoint-selector: invalid label value {value!r}")
        return value

    for raw in _split_requirements(text):
        part = raw.strip()
        if not part:
            if text.strip():
                raise KubernetesArgsError(f"--endpoint-selector: empty requirement in {text!r}")
            continue
        m = _SET_REQ.fullmatch(part)
        if m:
            values = [value_ok(v.strip()) for v in m.group(3).split(",")]
            if not any(values):
                raise KubernetesArgsError(f"--endpoint-selector: {part!r} needs at least one value")
            reqs.append(f"{key_ok(m.group(1))} {m.group(2)} ({','.join(values)})")
            only_equality = False
        elif "!=" in part:
            key, _, value = part.partition("!=")
            reqs.append(f"{key_ok(key.strip())}!={value_ok(value.strip())}")
            only_equality = False
        elif "=" in part:
            key, _, value = part.partition("==") if "==" in part else part.partition("=")
            key, value = key_ok(key.strip()), value_ok(value.strip())
            reqs.append(f"{key}={value}")
            equal[key] = value
        elif part.startswith("!"):
            reqs.append(f"!{key_ok(part[1:].strip())}")
            only_equality = False
        else:
            if any(c in part for c in "() "):
                raise KubernetesArgsError(f"--endpoint-selector: cannot parse {part!r}")
            reqs.append(key_ok(part))
            only_equality = False
    if not reqs:
        raise KubernetesArgsError("--endpoint-selector: empty selector")
    return (equal if only_equality else None), ",".join(reqs)


def parse_selector(text: str) -> dict[str, str]:
    """`k=v,k2=v2` (the matchLabels form; set-based expressions are not part of the InferencePool API)."""
    out: dict[str, str] = {}
    for part in text.split(","):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise KubernetesArgsError(f"--endpoint-selector: expected k=v pairs, got {part!r}")
        out[key.strip()] = value.strip()
    if not out:
        raise KubernetesArgsError("--endpoint-selector: empty selector")
    return out


def parse_ports(text: str) -> list[int]:
    try:
        return [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise KubernetesArgsError(f"--endpoint-target-ports: expected comma-separated integers, got {text!r}") from None


@dataclass(frozen=True)
class PoolSpec:
    match_labels: dict[str, str]
    target_ports: list[int]
    selector: str = ""  # a set-based selector (standalone mode); else the match_labels are the selector


def pool_spec(pool: dict[str, Any]) -> PoolSpec | None:
    """The parts of an InferencePool discovery uses, or None (with a log line) when they are unusable."""
    name = pool.get("metadata", {}).get("name")
    spec = pool.get("spec") or {}
    labels = (spec.get("selector") or {}).get("matchLabels") or {}
    ports: list[int] = []
    for item in spec.get("targetPorts") or []:
        number = item.get("number") if isinstance(item, dict) else None
        if isinstance(number, int) and not isinstance(number, bool):
            ports.append(number)
    if not labels or not ports:
        log.error("InferencePool %s: needs spec.selector.matchLabels and spec.targetPorts; ignoring it", name)
        return None
    return PoolSpec({str(k): str(v) for k, v in labels.items()}, ports)


class _PodHandler:
    """Routes one pod informer's callbacks to PodEndpoints; a retired handler (old selector) goes quiet."""

    def __init__(self, source: KubernetesEndpointSource, pods: PodEndpoints) -> None:
        self.source, self.pods, self.active = source, pods, True

    def on_replace(self, objects: Sequence[dict[str, Any]]) -> None:
        if self.active:
            self.pods.replace(objects)
            self.source._pods_synced()

    def on_upsert(self, obj: dict[str, Any]) -> None:
        if self.active:
            self.pods.upsert(obj)

    def on_delete(self, obj: dict[str, Any]) -> None:
        if self.active:
            self.pods.delete(obj)


class _PoolHandler:
    def __init__(self, source: KubernetesEndpointSource) -> None:
        self.source = source

    def on_replace(self, objects: Sequence[dict[str, Any]]) -> None:
        if objects:
            self.on_upsert(objects[0])
        else:
            log.warning("InferencePool %s/%s not found; no endpoints", self.source.config.namespace, self.source.pool)
            self.source._pool_gone()

    def on_upsert(self, obj: dict[str, Any]) -> None:
        spec = pool_spec(obj)
        if spec is None:
            self.source._pool_gone()
        else:
            self.source._apply_pool(spec)

    def on_delete(self, obj: dict[str, Any]) -> None:
        log.warning("InferencePool %s/%s deleted; clearing endpoints", self.source.config.namespace, self.source.pool)
        self.source._pool_gone()


ApiFactory = Callable[[], Awaitable[client.ApiClient]]


class KubernetesEndpointSource:
    """EndpointSource backed by the Kubernetes API (see the module docstring)."""

    def __init__(
        self,
        config: KubernetesDiscoveryConfig,
        *,
        objectives: ObjectiveStore | None = None,
        api_factory: ApiFactory | None = None,
        backoff: Callable[[], Backoff] = Backoff,
    ) -> None:
        self.config = config
        self.pool = config.pool_name or ""
        self.objectives = objectives
        self._api_factory = api_factory or (lambda: api_client(config.kubeconfig))
        self._backoff = backoff
        self._api: client.ApiClient | None = None
        self._datastore: Datastore | None = None
        self._pods: PodEndpoints | None = None
        self._pod_handler: _PodHandler | None = None
        self._pod_task: asyncio.Task[None] | None = None
        self._retired: set[asyncio.Task[None]] = set()
        self._spec: PoolSpec | None = None
        self.pod_informer: Informer | None = None
        self.pool_informer: Informer | None = None
        self.objective_informer: Informer | None = None
        self.pod_informer_starts = 0

    def _informer(self, kind: ResourceKind, handler: Any, **kw: Any) -> Informer:
        assert self._api is not None
        return Informer(
            self._api,
            kind,
            self.config.namespace,
            handler,
            watch_timeout=self.config.watch_timeout,
            backoff=self._backoff(),
            **kw,
        )

    async def run(self, datastore: Datastore) -> None:
        self._datastore = datastore
        self._api = await self._api_factory()
        tasks: list[asyncio.Task[None]] = []
        try:
            if self.config.pool_name:
                self.pool_informer = self._informer(
                    INFERENCE_POOLS, _PoolHandler(self), field_selector=f"metadata.name={self.config.pool_name}"
                )
                tasks.append(asyncio.create_task(self.pool_informer.run(), name="k8s-pool-informer"))
                if self.objectives is not None and self.config.watch_objectives:
                    handler = ObjectiveHandler(self.objectives, self.config.pool_name, self.config.pool_group)
                    self.objective_informer = self._informer(INFERENCE_OBJECTIVES, handler)
                    tasks.append(asyncio.create_task(self.objective_informer.run(), name="k8s-objective-informer"))
            else:
                labels = dict(self.config.endpoint_selector or {})
                ports = list(self.config.target_ports)
                self._apply_pool(PoolSpec(labels, ports, selector=self.config.endpoint_selector_expr or ""))
            await asyncio.gather(*tasks) if tasks else await asyncio.Event().wait()
        finally:
            for t in tasks:
                t.cancel()
            self._stop_pods()
            await _reap([*tasks, *self._retired])
            self._retired.clear()
            await self._api.close()
            self._api = None

    # ---- state changes driven by the pool informer ------------------------------------------------------------
    def _apply_pool(self, spec: PoolSpec) -> None:
        old = self._spec
        self._spec = spec
        if old is not None and old.match_labels == spec.match_labels and self._pods is not None:
            if old.target_ports != spec.target_ports:
                log.log(
                    V(DEFAULT),
                    "InferencePool %s: targetPorts %s -> %s; resyncing",
                    self.pool,
                    old.target_ports,
                    spec.target_ports,
                )
                self._pods.target_ports = list(spec.target_ports)
                assert self.pod_informer is not None
                if self.pod_informer.synced.is_set():  # else its first list applies the new ports
                    self._pods.replace(self.pod_informer.store.values())
            return
        if old is not None:
            log.log(
                V(DEFAULT),
                "InferencePool %s: selector %s -> %s; resyncing pods",
                self.pool,
                old.match_labels,
                spec.match_labels,
            )
        self._start_pods(spec)

    def _pool_gone(self) -> None:
        self._spec = None
        self._stop_pods()
        assert self._datastore is not None
        self._datastore.clear()
        self._datastore.synced = False

    def _pods_synced(self) -> None:
        assert self._datastore is not None
        if not self._datastore.synced:
            log.info("kubernetes discovery synced: %d endpoints", len(self._datastore.endpoints()))
        self._datastore.synced = True

    def _start_pods(self, spec: PoolSpec) -> None:
        """(Re)start the pod watch for a selector; the new informer's first list replaces the old pods' endpoints."""
        assert self._datastore is not None
        if self._pod_handler is not None:
            self._pod_handler.active = False
        if self._pod_task is not None:
            self._pod_task.cancel()
            self._retired.add(self._pod_task)
            self._pod_task.add_done_callback(self._retired.discard)
        if self._pods is None:
            self._pods = PodEndpoints(self._datastore, spec.target_ports, self.config.model_server_metrics_port)
        self._pods.target_ports = list(spec.target_ports)
        self._pod_handler = _PodHandler(self, self._pods)
        self.pod_informer = self._informer(
            PODS, self._pod_handler, label_selector=spec.selector or selector_string(spec.match_labels)
        )
        self.pod_informer_starts += 1
        self._pod_task = asyncio.create_task(self.pod_informer.run(), name="k8s-pod-informer")

    def _stop_pods(self) -> None:
        if self._pod_handler is not None:
            self._pod_handler.active = False
            self._pod_handler = None
        if self._pod_task is not None:
            self._pod_task.cancel()
            self._retired.add(self._pod_task)
            self._pod_task.add_done_callback(self._retired.discard)
            self._pod_task = None
        if self._pods is not None:
            self._pods.clear()
            self._pods = None
        self.pod_informer = None


async def _reap(tasks: Sequence[asyncio.Task[None]]) -> None:
    for t in tasks:
        t.cancel()
    for t in tasks:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await t


# ---- CLI ----------------------------------------------------------------------------------------------------------
def add_kubernetes_args(parser: argparse.ArgumentParser) -> None:
    """GIE's discovery flags (same names and defaults)."""
    g = parser.add_argument_group("kubernetes discovery")
    g.add_argument("--pool-name", help="InferencePool to serve (exclusive with --endpoint-selector)")
    g.add_argument(
        "--pool-namespace",
        default=os.environ.get("NAMESPACE") or "default",
        help="namespace of the pool and its pods (default: $NAMESPACE, else default)",
    )
    g.add_argument("--pool-group", default=DEFAULT_POOL_GROUP, help="API group of the InferencePool")
    g.add_argument("--endpoint-selector", help="standalone mode without the CRD: pod label selector k=v,k2=v2")
    g.add_argument("--endpoint-target-ports", help="standalone mode: comma-separated model server ports (1-8)")
    g.add_argument(
        "--model-server-metrics-port", type=int, help="scrape this port instead (only with a single target port)"
    )
    g.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster service account, else ~/.kube/config)")


def kubernetes_config_from_args(args: argparse.Namespace) -> KubernetesDiscoveryConfig | None:
    """None when neither --pool-name nor --endpoint-selector is given (static discovery from the config file)."""
    pool_name = getattr(args, "pool_name", None)
    selector = getattr(args, "endpoint_selector", None)
    if not pool_name and not selector:
        if getattr(args, "endpoint_target_ports", None):
            raise KubernetesArgsError("--endpoint-target-ports needs --endpoint-selector")
        return None
    equality: dict[str, str] | None = None
    expr: str | None = None
    if selector:
        equality, normalized = label_selector(selector)
        expr = None if equality is not None else normalized
    ports_text = getattr(args, "endpoint_target_ports", None)
    if pool_name and ports_text:
        raise KubernetesArgsError("--endpoint-target-ports is only for --endpoint-selector (the pool has targetPorts)")
    return KubernetesDiscoveryConfig(
        namespace=args.pool_namespace,
        pool_name=pool_name or None,
        pool_group=args.pool_group,
        endpoint_selector=equality,
        endpoint_selector_expr=expr,
        target_ports=parse_ports(ports_text) if ports_text else [],
        model_server_metrics_port=args.model_server_metrics_port,
        kubeconfig=args.kubeconfig,
    )


def kubernetes_source_from_args(
    args: argparse.Namespace, *, objectives: ObjectiveStore | None = None
) -> KubernetesEndpointSource | None:
    cfg = kubernetes_config_from_args(args)
    return KubernetesEndpointSource(cfg, objectives=objectives) if cfg is not None else None
