"""redis-cross-replica-syncer: shares per-endpoint state (the inflight-load-producer's in-flight requests and tokens)
between active-active EPP replicas through Redis/Valkey, so N replicas behind one Envoy see each other's load.

llm-d v0.10 defines the seam (`dataLayer.crossReplicaSyncerPluginRef`, `crossReplicaSyncInterval` default 200 ms,
contributors that opt out with `syncCrossReplicaState: false`) but ships only an in-memory mock (`local-syncer`);
this is a working one. Every interval, one Lua call per replica: publish this replica's snapshot of each contributor
(`SET <prefix>:<state key>:<replica> <json> PX ttl`), refresh its heartbeat in `<prefix>:replicas` (a sorted set by
time), drop replicas silent for `ttl`, and read the other live replicas' snapshots, which are summed per endpoint
and handed back to the contributor (`remote_*` of each endpoint's `InFlightLoad`). The replica's own counts stay
live; only the others' are up to one interval old. A replica that dies stops counting after `ttl`. If Redis is
unreachable the remote part is cleared after `ttl` (each replica falls back to its own view) and retried.

Messengers (e.g. the precise prefix producer's "this prompt is being computed on that pod" at each pick) are not
worth waiting an interval for: their messages go out as they are queued, batched, on one Redis pub/sub channel
(`<prefix>:msg`), and every other replica subscribed hands them to its plugin of the same channel; a batch holds
what fits one payload of `MAX_PAYLOAD` bytes, which receivers refuse beyond. Best effort: a full outbox drops the
oldest, a Redis outage drops what was queued, and a message that fits no payload is dropped by its sender.

Redis unreachable (a sync round, a publish or the subscription failing): the replica routes on its own state. It
says so once in a warning and in `epp_cross_replica_connected` (0), drops the other replicas' snapshots after `ttl`
and what their messages booked at once (`cross_replica_reset`: no release would come for it), and retries. When Redis
answers again it says so in a log line and the gauge (1), and the next round and the next messages bring the others'
state back; what they booked during the outage is not replayed (it counts again from their next snapshot round).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any, Self

from prometheus_client import Counter, Gauge

from epp.framework import CrossReplicaContributor, CrossReplicaMessenger, Params, Plugin, PluginContext

log = logging.getLogger(__name__)

DEFAULT_INTERVAL = 0.2

SYNCS = Counter("epp_cross_replica_syncs", "Cross-replica sync rounds by result", ["result"])
PEERS = Gauge("epp_cross_replica_peers", "Other live EPP replicas seen in the last sync round")
CONNECTED = Gauge(
    "epp_cross_replica_connected",
    "1 while the cross-replica store (Redis/Valkey) answers; 0 while this replica routes on its own state only",
)
MESSAGES = Counter(
    "epp_cross_replica_messages",
    "Cross-replica messages (e.g. speculative prefix entries) by direction and result",
    ["direction", "result"],
)

MAX_OUTBOX = 4096  # queued messages; the oldest are dropped beyond
MAX_BATCH = 256  # messages per PUBLISH
MAX_PAYLOAD = 4 << 20  # bytes; a larger published payload is refused by the receivers
_MAX_PARTS = MAX_PAYLOAD - 1024  # the messages of one payload, in bytes (the rest is room for its envelope)

# KEYS: none (one Redis, keys under the prefix). ARGV: prefix, replica, now_ms, ttl_ms, n, then n × (key, json).
# Returns: the live replicas, then for each contributor the other replicas' snapshots (false when missing).
_SYNC = """
local prefix, me, now, ttl, n = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local reg = prefix .. ':replicas'
redis.call('ZADD', reg, now, me)
redis.call('ZREMRANGEBYSCORE', reg, '-inf', now - ttl)
redis.call('PEXPIRE', reg, ttl * 10)
local replicas = redis.call('ZRANGE', reg, 0, -1)
local out = {replicas}
for i = 0, n - 1 do
  local key = ARGV[6 + 2 * i]
  redis.call('SET', prefix .. ':' .. key .. ':' .. me, ARGV[7 + 2 * i], 'PX', ttl)
  local vals = {}
  for _, r in ipairs(replicas) do
    if r ~= me then vals[#vals + 1] = redis.call('GET', prefix .. ':' .. key .. ':' .. r) end
  end
  out[#out + 1] = vals
end
return out
"""


def default_replica_id() -> str:
    return f"{socket.gethostname() or 'epp'}-{os.getpid()}"


def sum_snapshots(snapshots: Sequence[Any]) -> dict[str, list[int]]:
    """Per-endpoint element-wise sums of JSON snapshots ({endpoint: [ints]}); malformed ones are skipped."""
    parsed = []
    for raw in snapshots:
        if not raw:
            continue
        try:
            parsed.append(json.loads(raw))
        except ValueError:
            continue
    return sum_parsed(parsed)


def sum_parsed(snapshots: Iterable[Any]) -> dict[str, list[int]]:
    """`sum_snapshots` of snapshots already parsed; anything not {endpoint: [ints]} is skipped."""
    total: dict[str, list[int]] = {}
    for snap in snapshots:
        if not isinstance(snap, dict):
            continue
        for ep, vals in snap.items():
            if not isinstance(vals, list):
                continue
            acc = total.setdefault(str(ep), [])
            for i, v in enumerate(vals):
                if isinstance(v, int) and not isinstance(v, bool):
                    if i < len(acc):
                        acc[i] += v
                    else:
                        acc.extend([0] * (i - len(acc)) + [v])
    return total


def _cancel_requested() -> bool:
    """Whether this task was asked to stop. redis-py can swallow a cancellation: when its socket timeout expires at
    the same moment (a loaded box), the CancelledError becomes its TimeoutError, which its retry policy then retries
    and the call returns normally. A loop would keep going and whoever awaits the task (shutdown) would hang, so each
    loop checks after every Redis call."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _stop_if_cancelled() -> None:
    if _cancel_requested():
        raise asyncio.CancelledError


class _Link:
    """Whether Redis answers, as the loops find it: the first failure after a success says so (log, gauge) and runs
    `on_down`; the first success after a failure says so again."""

    def __init__(self, what: str, on_down: Callable[[], None]) -> None:
        self.what = what
        self.on_down = on_down
        self.up: bool | None = None  # None: not tried yet

    def ok(self) -> None:
        if self.up is not True:
            if self.up is False:
                log.warning("%s: reachable again; sharing state with the other replicas", self.what)
            self.up = True
            CONNECTED.set(1)

    def failed(self, e: Exception) -> None:
        if self.up is not False:
            log.warning(
                "%s: unreachable (%s); routing on this replica's own state until it answers again", self.what, e
            )
            self.up = False
            CONNECTED.set(0)
            self.on_down()


class _Failures:
    """One Redis loop's run of failures: counted, logged on the first and every 100th, then backed off. A failure
    that is really a cancellation redis-py swallowed (see `_cancel_requested`) stops the loop instead."""

    def __init__(self, what: str, link: _Link | None = None) -> None:
        self.what = what
        self.count = 0
        self.link = link

    def ok(self) -> None:
        self.count = 0
        if self.link is not None:
            self.link.ok()

    async def failed(self, e: Exception, backoff: float = 0.0) -> None:
        if _cancel_requested():
            raise asyncio.CancelledError from e
        self.count += 1
        if self.count == 1 or self.count % 100 == 0:
            log.warning("%s failed (%d): %s", self.what, self.count, e)
        if self.link is not None:
            self.link.failed(e)
        if backoff > 0:
            await asyncio.sleep(backoff)


class RedisCrossReplicaSyncer(Plugin):
    type_name = "redis-cross-replica-syncer"

    def __init__(
        self,
        name: str | None = None,
        *,
        address: str = "redis://127.0.0.1:6379",
        replica_id: str | None = None,
        key_prefix: str = "epp:crossreplica:default",
        ttl: float = 2.0,
    ) -> None:
        super().__init__(name)
        self.address = address
        self.replica_id = replica_id or default_replica_id()
        self.key_prefix = key_prefix
        self.ttl = ttl
        self.interval = DEFAULT_INTERVAL
        self.contributors: list[CrossReplicaContributor] = []
        self.peers: list[str] = []
        self.rounds = 0
        self._last_ok = 0.0
        self.messengers: dict[str, CrossReplicaMessenger] = {}
        # who sent a message: unique per process even if two replicas were given the same replicaId
        self.sender = f"{self.replica_id}/{uuid.uuid4().hex[:12]}"
        self._outbox: deque[tuple[str, Any]] = deque()
        self._wake: asyncio.Event | None = None
        self.link = _Link(f"{self.name}: Redis at {address}", self._link_down)

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        syncer = cls(
            name,
            address=params.str("address", "redis://127.0.0.1:6379"),
            replica_id=params.str("replicaId", "") or None,
            key_prefix=params.str("keyPrefix", "") or f"epp:crossreplica:{context.pool_name}",
            ttl=params.duration("ttl", 2.0),
        )
        if not syncer.address.startswith(("redis://", "rediss://", "unix://", "valkey://")):
            raise params.fail("address", "expected a redis://, rediss://, valkey:// or unix:// URL")
        if syncer.ttl <= 0:
            raise params.fail("ttl", "must be positive")
        context.run_in_background(syncer.run)
        return syncer

    def attach(self, contributors: Sequence[CrossReplicaContributor], interval: float | None) -> None:
        self.contributors = list(contributors)
        if interval is not None:
            self.interval = interval
        if self.ttl <= self.interval:
            log.warning("%s: ttl %.3fs <= sync interval %.3fs; using 5 intervals", self.name, self.ttl, self.interval)
            self.ttl = 5 * self.interval

    def attach_messengers(self, messengers: Sequence[CrossReplicaMessenger]) -> None:
        for m in messengers:
            channel = m.cross_replica_channel()
            if channel:
                self.messengers[channel] = m
                m.cross_replica_connect(partial(self._send, channel))

    @property
    def message_channel(self) -> str:
        return f"{self.key_prefix}:msg"

    def _send(self, channel: str, message: Any) -> None:
        """Queue one message (never blocks; the oldest is dropped when the outbox is full)."""
        if len(self._outbox) >= MAX_OUTBOX:
            self._outbox.popleft()
            MESSAGES.labels("out", "dropped").inc()
        self._outbox.append((channel, message))
        if self._wake is not None:
            self._wake.set()

    async def run(self) -> None:
        if not self.contributors and not self.messengers:
            return
        import redis.asyncio as redis

        url = self.address.replace("valkey://", "redis://", 1)
        client = redis.Redis.from_url(url, socket_timeout=max(1.0, self.ttl), socket_connect_timeout=2.0)
        try:
            async with asyncio.TaskGroup() as tg:
                if self.contributors:
                    tg.create_task(self._sync_loop(client, url))
                if self.messengers:
                    tg.create_task(self._publish_loop(client, url))
                    tg.create_task(self._subscribe_loop(client, url))
        finally:
            await client.aclose()

    def _link_down(self) -> None:
        """Redis is unreachable: what the other replicas' messages booked here is dropped (queued messages too)."""
        self._outbox.clear()
        for m in self.messengers.values():
            try:
                m.cross_replica_reset()
            except Exception:
                log.exception("%s: %s failed to reset", self.name, m.name)

    async def _sync_loop(self, client: Any, url: str) -> None:
        script = client.register_script(_SYNC)
        failures = _Failures(f"{self.name}: cross-replica sync with {url}", self.link)
        while True:
            started = time.monotonic()
            try:
                await self.sync_once(script)
                failures.ok()
            except Exception as e:
                await failures.failed(e)  # no backoff: the round's interval follows
                SYNCS.labels("error").inc()
                if time.monotonic() - self._last_ok > self.ttl:
                    self._clear_remote()
            _stop_if_cancelled()
            await asyncio.sleep(max(0.0, self.interval - (time.monotonic() - started)))

    @property
    def _backoff(self) -> float:
        return min(1.0, max(0.05, self.interval))

    async def _publish_loop(self, client: Any, url: str) -> None:
        """Publish queued messages as they come, in batches of up to MAX_BATCH."""
        wake = self._wake = asyncio.Event()
        failures = _Failures(f"{self.name}: publishing to {url}", self.link)
        while True:
            if not self._outbox:
                wake.clear()
                await wake.wait()
            batch = self._next_batch()
            if not batch:
                continue
            payload = f'{{"from":{json.dumps(self.sender)},"m":[{",".join(batch)}]}}'
            try:
                await client.publish(self.message_channel, payload)
                MESSAGES.labels("out", "sent").inc(len(batch))
                failures.ok()
            except Exception as e:
                MESSAGES.labels("out", "error").inc(len(batch))
                await failures.failed(e, self._backoff)
            _stop_if_cancelled()

    def _next_batch(self) -> list[str]:
        """The next queued messages, serialized, as many as one payload the receivers accept holds (at most
        MAX_BATCH); a message that fits no payload, or is not JSON, is dropped (counted)."""
        parts: list[str] = []
        size = 0
        outbox = self._outbox
        while outbox and len(parts) < MAX_BATCH:
            item = outbox.popleft()
            try:
                part = json.dumps(item, separators=(",", ":"))
            except (TypeError, ValueError):
                MESSAGES.labels("out", "invalid").inc()
                continue
            if len(part) > _MAX_PARTS:
                MESSAGES.labels("out", "too_large").inc()
                continue
            if size + len(part) + 1 > _MAX_PARTS:
                outbox.appendleft(item)  # the next payload's first
                break
            parts.append(part)
            size += len(part) + 1
        return parts

    async def _subscribe_loop(self, client: Any, url: str) -> None:
        """Receive the other replicas' messages; resubscribe after a failure."""
        failures = _Failures(f"{self.name}: subscription on {url}", self.link)
        while True:
            pubsub = client.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self.message_channel)
                failures.ok()
                while True:
                    msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                    _stop_if_cancelled()
                    if msg is not None and msg.get("type") == "message":
                        self.deliver(msg.get("data"))
            except Exception as e:
                await failures.failed(e, self._backoff)
            finally:
                await pubsub.aclose()

    def deliver(self, data: Any) -> int:
        """Hand one published payload's messages to their messengers; returns how many were delivered. Our own
        payloads and malformed ones are skipped (counted), a messenger's failure is logged and does not stop the
        others."""
        if not isinstance(data, bytes | str) or len(data) > MAX_PAYLOAD:
            MESSAGES.labels("in", "invalid").inc()
            return 0
        try:
            payload = json.loads(data)
        except ValueError:
            MESSAGES.labels("in", "invalid").inc()
            return 0
        if not isinstance(payload, dict) or not isinstance(payload.get("m"), list):
            MESSAGES.labels("in", "invalid").inc()
            return 0
        if payload.get("from") == self.sender:
            return 0
        n = 0
        for item in payload["m"]:
            if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)):
                MESSAGES.labels("in", "invalid").inc()
                continue
            messenger = self.messengers.get(item[0])
            if messenger is None:
                MESSAGES.labels("in", "unknown_channel").inc()
                continue
            try:
                messenger.cross_replica_receive(item[1])
            except Exception:
                MESSAGES.labels("in", "error").inc()
                log.exception("%s: %s failed on a cross-replica message", self.name, messenger.name)
                continue
            n += 1
        if n:
            MESSAGES.labels("in", "delivered").inc(n)
        return n

    async def sync_once(self, script: Any) -> None:
        argv: list[Any] = [self.key_prefix, self.replica_id, int(time.time() * 1000), int(self.ttl * 1000)]
        keyed = [(c, c.cross_replica_key()) for c in self.contributors]
        keyed = [(c, k) for c, k in keyed if k]
        argv.append(len(keyed))
        for c, k in keyed:
            argv.extend((k, json.dumps(c.cross_replica_snapshot(), separators=(",", ":"))))
        reply = await script(keys=[], args=argv)
        replicas = [r.decode() if isinstance(r, bytes) else str(r) for r in reply[0]]
        self.peers = [r for r in replicas if r != self.replica_id]
        PEERS.set(len(self.peers))
        for (c, _), snapshots in zip(keyed, reply[1:], strict=False):
            c.cross_replica_update(sum_snapshots(snapshots))
        self.rounds += 1
        self._last_ok = time.monotonic()
        SYNCS.labels("ok").inc()

    def _clear_remote(self) -> None:
        for c in self.contributors:
            c.cross_replica_update({})
        self.peers = []
        PEERS.set(0)
