"""The interface every discovery source implements (static list now, Kubernetes watcher later)."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from epp.datalayer.datastore import Datastore


@runtime_checkable
class EndpointSource(Protocol):
    async def run(self, datastore: Datastore) -> None:
        """Fill the datastore, set `datastore.synced`, then keep it current until cancelled."""
        ...
