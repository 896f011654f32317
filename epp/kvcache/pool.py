"""The KV-event pool: subscriptions → sharded workers (with replay) → index, on the server's asyncio loop.

`EventPool` assembles the three parts and is what the EPP holds: `subscriptions` is the Datastore listener
(epp.kvcache.subscriptions), `workers` validate, order and apply batches (epp.kvcache.workers) and replay
through `workers.replayer` (epp.kvcache.replay); `run()` is the background coroutine the server starts.
Nothing here knows of gRPC.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from epp.kvcache.config import PoolConfig
from epp.kvcache.ingest import ApplyStats, EventApplier
from epp.kvcache.metrics import PoolMetrics, default_metrics
from epp.kvcache.replay import Replayer
from epp.kvcache.subscriptions import Subscriptions
from epp.kvcache.workers import ShardedWorkers


class EventPool:
    """One per EPP: subscribe `subscriptions` to the endpoints and run `run()` in the background."""

    def __init__(
        self,
        applier: EventApplier,
        config: PoolConfig | None = None,
        metrics: PoolMetrics | None = None,
        on_applied: Callable[[str, ApplyStats], None] | None = None,
    ) -> None:
        self.cfg = config or PoolConfig()
        self.metrics = metrics or default_metrics()
        self.workers = ShardedWorkers(applier, self.cfg, self.metrics, on_applied)
        self.subscriptions = Subscriptions(self.cfg, self.workers, self.metrics)
        self._started = asyncio.Event()

    @property
    def replayer(self) -> Replayer:
        return self.workers.replayer

    async def run(self) -> None:
        self.workers.start()
        self.subscriptions.start()
        self._started.set()
        try:
            await asyncio.Event().wait()
        finally:
            await self.subscriptions.stop()
            await self.workers.stop()

    async def started(self) -> None:
        await self._started.wait()

    async def drain(self, timeout: float = 5.0) -> None:
        """Wait until the shard queues are empty and the workers idle (tests, benchmarks)."""
        await self.workers.drain(timeout)
