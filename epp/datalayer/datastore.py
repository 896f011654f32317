"""The pool's endpoints: written by discovery, read by the scheduler, watched by scrapers and the KV pool."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from epp.framework.context import EndpointListener
from epp.framework.types import Endpoint

log = logging.getLogger(__name__)


class Datastore:
    """Endpoints by name. Reads return an immutable snapshot, so the hot path never copies or locks."""

    def __init__(self) -> None:
        self._by_name: dict[str, Endpoint] = {}
        self._by_hostport: dict[str, Endpoint] = {}
        self._snapshot: tuple[Endpoint, ...] = ()
        self._listeners: list[EndpointListener] = []
        self._synced = False
        self._sync_watchers: list[Callable[[], None]] = []

    @property
    def synced(self) -> bool:
        """Discovery has listed the pool once (readiness waits for it)."""
        return self._synced

    @synced.setter
    def synced(self, value: bool) -> None:
        changed = value != self._synced
        self._synced = value
        if changed:
            for watcher in tuple(self._sync_watchers):
                watcher()

    def watch_synced(self, watcher: Callable[[], None]) -> Callable[[], None]:
        """Call `watcher()` whenever `synced` changes; returns the function that stops it."""
        self._sync_watchers.append(watcher)

        def stop() -> None:
            if watcher in self._sync_watchers:
                self._sync_watchers.remove(watcher)

        return stop

    def endpoints(self) -> tuple[Endpoint, ...]:
        return self._snapshot

    def get(self, name: str) -> Endpoint | None:
        return self._by_name.get(name)

    def get_by_hostport(self, hostport: str) -> Endpoint | None:
        return self._by_hostport.get(hostport)

    def subscribe(self, listener: EndpointListener) -> None:
        self._listeners.append(listener)
        for ep in self._snapshot:
            listener.endpoint_added(ep)

    def upsert(self, endpoint: Endpoint) -> bool:
        """Add or update; returns True if the set of endpoints changed. An address change is remove + add; other
        labels or attributes update the known endpoint in place and notify `endpoint_updated` (not remove + add,
        which would make listeners drop what they hold for it, e.g. its prefix-cache entries)."""
        old = self._by_name.get(endpoint.name)
        if old is not None:
            if old.hostport == endpoint.hostport and old.metrics_port == endpoint.metrics_port:
                changed = old.labels != endpoint.labels
                old.labels = endpoint.labels
                changed = old.attributes.update(endpoint.attributes) or changed
                if changed:
                    for listener in self._listeners:
                        self._notify(listener.endpoint_updated, old)
                return False
            self.remove(endpoint.name)
        self._by_name[endpoint.name] = endpoint
        self._by_hostport[endpoint.hostport] = endpoint
        self._rebuild()
        for listener in self._listeners:
            self._notify(listener.endpoint_added, endpoint)
        return True

    def remove(self, name: str) -> Endpoint | None:
        ep = self._by_name.pop(name, None)
        if ep is None:
            return None
        if self._by_hostport.get(ep.hostport) is ep:
            del self._by_hostport[ep.hostport]
        self._rebuild()
        for listener in self._listeners:
            self._notify(listener.endpoint_removed, ep)
        return ep

    def replace_all(self, endpoints: Iterable[Endpoint]) -> None:
        """Make the datastore hold exactly `endpoints` (used after a full re-list)."""
        wanted = {ep.name: ep for ep in endpoints}
        for name in list(self._by_name):
            if name not in wanted:
                self.remove(name)
        for ep in wanted.values():
            self.upsert(ep)

    def clear(self) -> None:
        self.replace_all(())

    def _rebuild(self) -> None:
        self._snapshot = tuple(self._by_name.values())

    @staticmethod
    def _notify(fn: object, endpoint: Endpoint) -> None:
        try:
            fn(endpoint)  # type: ignore[operator]
        except Exception:
            log.exception("endpoint listener failed for %s", endpoint.name)
