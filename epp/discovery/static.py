"""Discovery from a fixed list in the config file (`endpoints: [{address, port, labels}]`)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from epp.datalayer.datastore import Datastore
from epp.framework.types import Endpoint


class StaticEndpointSource:
    def __init__(self, endpoints: Sequence[Endpoint]) -> None:
        self._endpoints = list(endpoints)

    async def run(self, datastore: Datastore) -> None:
        datastore.replace_all(self._endpoints)
        datastore.synced = True
        await asyncio.Event().wait()
