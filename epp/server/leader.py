"""`--ha-enable-leader-election`: active-passive HA on a coordination.k8s.io/v1 Lease, as llm-d-router v0.10 does it
through controller-runtime (lease `epp-<namespace>-<pool>.llm-d.ai` in the pool's namespace, ReleaseOnCancel).

client-go's algorithm: a candidate takes the Lease when it is absent, released (no holder) or expired; expiry is
judged by the local time at which this process last saw the record change (never by comparing clocks with the
holder). The leader renews every `retry_period`; if it cannot renew within `renew_deadline` it has lost the lease,
and, like the Go EPP (whose manager exits), the EPP stops. Every write carries the resourceVersion it read, so two
candidates can never both win the same round (the API server answers 409 to the second).

Without the flag every replica is active (pyepp's default; see docs/architecture.md, HA).
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import os
import random
import socket
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

log = logging.getLogger(__name__)


def lease_name(namespace: str, pool: str) -> str:
    """llm-d-router v0.10's LeaderElectionID (pkg/epp/server/controller_manager.go)."""
    return f"epp-{namespace}-{pool}.llm-d.ai"


def default_identity() -> str:
    """controller-runtime's: hostname (the pod name in a cluster) + '_' + a random UUID."""
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4()}"


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class LeaderElectionConfig:
    namespace: str
    name: str
    identity: str = field(default_factory=default_identity)
    lease_duration: float = 15.0  # controller-runtime's defaults
    renew_deadline: float = 10.0
    retry_period: float = 2.0


class LeaderElector:
    """Run `run()` as a task: `elected` is set once this process holds the Lease, `lost` if it then loses it."""

    def __init__(self, api: client.ApiClient, cfg: LeaderElectionConfig) -> None:
        # Any: bodies go as plain dicts and answers are read raw (_preload_content=False)
        self.api: Any = client.CoordinationV1Api(api)
        self.cfg = cfg
        self.elected = asyncio.Event()
        self.lost = asyncio.Event()
        self._observed: tuple[str, float] | None = None  # (holder record as JSON, local monotonic time seen)
        self._last: dict[str, Any] | None = None  # the Lease as last read or written
        self.transitions_seen = 0

    @property
    def is_leader(self) -> bool:
        return self.elected.is_set() and not self.lost.is_set()

    async def run(self) -> None:
        cfg = self.cfg
        while not await self._try_acquire_or_renew():
            await asyncio.sleep(cfg.retry_period * (1 + random.random() * 0.2))
        log.info("leader election: %s is now the leader of lease %s/%s", cfg.identity, cfg.namespace, cfg.name)
        self.elected.set()
        last_renew = time.monotonic()
        while True:
            await asyncio.sleep(cfg.retry_period)
            try:
                ok = await asyncio.wait_for(self._try_acquire_or_renew(), timeout=cfg.renew_deadline)
            except TimeoutError:
                ok = False
            if ok:
                last_renew = time.monotonic()
            elif time.monotonic() - last_renew >= cfg.renew_deadline:
                log.error("leader election lost: lease %s/%s not renewed within %.1fs", cfg.namespace, cfg.name,
                          cfg.renew_deadline)  # fmt: skip
                self.lost.set()
                return

    @staticmethod
    async def _json(call: Any) -> dict[str, Any]:
        """A raw (_preload_content=False) call's JSON body; a non-2xx answer raises ApiException."""
        resp = await call
        body = await resp.read()
        if not 200 <= resp.status < 300:
            raise ApiException(status=resp.status, reason=body.decode(errors="replace")[:200])
        data: dict[str, Any] = json.loads(body)
        return data

    async def _read(self) -> dict[str, Any] | None:
        try:
            return await self._json(
                self.api.read_namespaced_lease(self.cfg.name, self.cfg.namespace, _preload_content=False)
            )
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    async def _try_acquire_or_renew(self) -> bool:
        cfg = self.cfg
        now = _now()
        try:
            lease = await self._read()
            if lease is None:
                body = {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {"name": cfg.name, "namespace": cfg.namespace},
                    "spec": self._spec(now, now, 0),
                }
                self._last = await self._json(
                    self.api.create_namespaced_lease(cfg.namespace, body, _preload_content=False)
                )
                return True
            spec = lease.get("spec") or {}
            holder = spec.get("holderIdentity") or ""
            record = json.dumps(spec, sort_keys=True)
            if self._observed is None or self._observed[0] != record:
                self._observed = (record, time.monotonic())
            if holder and holder != cfg.identity:
                duration = float(spec.get("leaseDurationSeconds") or cfg.lease_duration)
                if time.monotonic() < self._observed[1] + duration:
                    return False  # held by another candidate and not expired
            transitions = int(spec.get("leaseTransitions") or 0)
            if holder == cfg.identity:
                acquire = spec.get("acquireTime") or now
            else:
                acquire = now
                transitions += 1
            lease["spec"] = self._spec(acquire, now, transitions)
            self._last = await self._json(
                self.api.replace_namespaced_lease(cfg.name, cfg.namespace, lease, _preload_content=False)
            )
            self._observed = (json.dumps(self._last.get("spec") or {}, sort_keys=True), time.monotonic())
            return True
        except ApiException as e:
            if e.status != 409:
                log.warning("leader election: lease %s/%s: %s %s", cfg.namespace, cfg.name, e.status, e.reason)
            return False
        except (TimeoutError, OSError, ValueError) as e:
            log.warning("leader election: lease %s/%s: %s", cfg.namespace, cfg.name, e)
            return False

    def _spec(self, acquire: str, renew: str, transitions: int) -> dict[str, Any]:
        return {
            "holderIdentity": self.cfg.identity,
            "leaseDurationSeconds": max(1, round(self.cfg.lease_duration)),
            "acquireTime": acquire,
            "renewTime": renew,
            "leaseTransitions": transitions,
        }

    async def release(self) -> None:
        """ReleaseOnCancel: a leader clears the holder (duration 1s) so a standby takes over at once.

        The renewal the caller just cancelled may have reached the server without its answer reaching us, leaving
        our copy one resourceVersion behind: a 409 re-reads the Lease and releases it if it is still ours."""
        if not self.is_leader or self._last is None:
            return
        lease: dict[str, Any] | None = self._last
        for _ in range(3):
            spec = dict((lease or {}).get("spec") or {})
            if lease is None or spec.get("holderIdentity") != self.cfg.identity:
                break  # gone, or someone else's by now: nothing of ours to release
            spec.update(holderIdentity="", leaseDurationSeconds=1, renewTime=_now())
            body = {**lease, "spec": spec}
            try:
                name, namespace = self.cfg.name, self.cfg.namespace
                call = self.api.replace_namespaced_lease(name, namespace, body, _preload_content=False)
                self._last = await asyncio.wait_for(self._json(call), timeout=5)
                log.info("leader election: released lease %s/%s", self.cfg.namespace, self.cfg.name)
                break
            except ApiException as e:
                if e.status != 409:
                    break
            except (OSError, TimeoutError):
                break
            try:
                lease = await asyncio.wait_for(self._read(), timeout=5)
            except (ApiException, OSError, TimeoutError):
                break
        self.lost.set()
