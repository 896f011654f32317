"""InferenceObjectives from the cluster → the ObjectiveStore admission reads (name → spec.priority).

Only objectives whose `spec.poolRef` names our pool (and group) count, like GIE's reconciler. Names set from the
config file stay unless the cluster defines the same name.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from epp.datalayer.objectives import ObjectiveStore
from epp.discovery.informer import object_name

log = logging.getLogger(__name__)

DEFAULT_POOL_GROUP = "inference.networking.k8s.io"


class ObjectiveHandler:
    """InformerHandler that keeps the cluster's objectives for one pool in an ObjectiveStore."""

    def __init__(self, store: ObjectiveStore, pool_name: str, pool_group: str = DEFAULT_POOL_GROUP) -> None:
        self.store, self.pool_name, self.pool_group = store, pool_name, pool_group
        self._owned: set[str] = set()
        self._shadowed: dict[str, int] = {}  # config-file priorities a cluster object overrides

    def _priority(self, obj: dict[str, Any]) -> int | None:
        """The objective's priority, or None when it is not for our pool."""
        spec = obj.get("spec") or {}
        ref = spec.get("poolRef") or {}
        if ref.get("name") != self.pool_name or (ref.get("group") or DEFAULT_POOL_GROUP) != self.pool_group:
            return None
        raw = spec.get("priority", 0)
        if raw is None:
            return 0
        if isinstance(raw, bool) or not isinstance(raw, int):
            log.warning("InferenceObjective %s: spec.priority %r is not an integer; using 0", object_name(obj), raw)
            return 0
        return raw

    def on_replace(self, objects: Sequence[dict[str, Any]]) -> None:
        wanted = {object_name(o): p for o in objects if (p := self._priority(o)) is not None}
        for name in self._owned - wanted.keys():
            self._release(name)
        for name, priority in wanted.items():
            self._claim(name, priority)

    def on_upsert(self, obj: dict[str, Any]) -> None:
        priority = self._priority(obj)
        if priority is None:
            self._release(object_name(obj))
        else:
            self._claim(object_name(obj), priority)

    def on_delete(self, obj: dict[str, Any]) -> None:
        self._release(object_name(obj))

    def _claim(self, name: str, priority: int) -> None:
        if name not in self._owned and name in self.store.names():
            self._shadowed[name] = self.store.priority(name)
        self._owned.add(name)
        self.store.set(name, priority)

    def _release(self, name: str) -> None:
        if name not in self._owned:
            return
        self._owned.discard(name)
        if name in self._shadowed:
            self.store.set(name, self._shadowed.pop(name))
        else:
            self.store.remove(name)
