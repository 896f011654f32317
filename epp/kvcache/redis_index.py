"""Redis/Valkey backend: the request-key → (pod, tier) map lives in Redis, shared by EPP replicas.

Each replica still keeps the engine-key bookkeeping (engine → request keys, reference counts) in
process: it has to see every event anyway, and the counts must not be multiplied by the number of
replicas. Entry changes are journaled by that local index and pushed to Redis in one pipeline per event
batch (`flush`, one Lua call); removals and pod clears prune empty hashes. A lookup is one Lua call that
walks the prompt's keys and stops at the first block nobody holds, so any replica — even one that ingests
no events — can score.

Layout (prefix `pyepp:kv:` by default): `<p>r:<request key>` HASH with fields `<pod>|<tier>`;
`<p>p:<pod>` SET of the request keys the pod holds (so clearing a pod needs no SCAN).

Outages: the shared map degrades to the in-process copy, which this replica keeps anyway. A circuit breaker opens
on the first lookup or flush that fails or takes longer than its budget (`LOOKUP_TIMEOUT`, far below the
producers' 400 ms); while it is open lookups are answered by the local copy, changes are kept in order (up to
`MAX_PENDING`; past it only a full rebuild can repair the shared map) and a background probe asks Redis for its
`run_id` every `PROBE_INTERVAL`. When Redis answers again, the kept changes are replayed if it is the same server
process; after a restart (another `run_id`, e.g. an empty Redis) or an overflow the shared map is rebuilt from the
local copy: the replica's pods cleared there, then every entry pushed. One log line and a metric per state change.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from prometheus_client import Counter, Gauge

from epp.framework.services import SpeculationHold
from epp.framework.types import PrefixMatch
from epp.kvcache.index import TIER_GPU, TIER_NAMES, MemoryIndex

log = logging.getLogger(__name__)

LOOKUP_TIMEOUT = 0.05  # one lookup's budget before the local copy answers (and the breaker opens)
FLUSH_TIMEOUT = 1.0  # one flush's budget
PROBE_INTERVAL = 0.5  # between two health probes (run_id) of Redis
MAX_PENDING = 1_000_000  # changes kept while Redis is down; past it the shared map is rebuilt on reconnect
REBUILD_CHUNK = 3_000  # entries per script call when rebuilding

UP = Gauge("kv_cache_index_redis_up", "1 while the Redis/Valkey KV index answers, 0 while the local copy does")
STATE_CHANGES = Counter("kv_cache_index_redis_state_changes", "Redis KV index up/down transitions", ["to"])
FALLBACK_LOOKUPS = Counter(
    "kv_cache_index_redis_fallback_lookups", "Lookups answered by the local copy (Redis down, slow or failing)"
)
PENDING = Gauge("kv_cache_index_redis_pending_changes", "Index changes waiting for Redis to come back")
RESYNCS = Counter(
    "kv_cache_index_redis_resyncs", "Reconnections by what was pushed: the kept changes or a full rebuild", ["kind"]
)

# KEYS[1] = hash; ARGV = fields. Delete the fields; delete the hash when it is empty.
_PRUNE = """
redis.call('HDEL', KEYS[1], unpack(ARGV))
if redis.call('HLEN', KEYS[1]) == 0 then redis.call('DEL', KEYS[1]) end
return 0
"""

# One call per flushed batch: ARGV = prefix, then triples (op "+"/"-", request key, "pod|tier").
# (Keys are built in the script, so this is for a standalone Redis/Valkey, not Redis Cluster.)
_APPLY = """
local p = ARGV[1]
for i = 2, #ARGV, 3 do
  local op, r, f = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local pod = string.match(f, '^(.*)|[^|]*$')
  if op == '+' then
    redis.call('HSET', p .. 'r:' .. r, f, '1')
    redis.call('SADD', p .. 'p:' .. pod, r)
  else
    local k = p .. 'r:' .. r
    redis.call('HDEL', k, f)
    if redis.call('HLEN', k) == 0 then redis.call('DEL', k) end
    redis.call('SREM', p .. 'p:' .. pod, r)
  end
end
return 0
"""

# KEYS = request keys in prompt order. Returns each key's fields joined by "\n" (one reply string per
# key: parsing thousands of small replies costs more than the lookup), stopping after the first empty key.
_LOOKUP = """
local out = {}
for i = 1, #KEYS do
  local f = redis.call('HKEYS', KEYS[i])
  out[i] = table.concat(f, '\\n')
  if #f == 0 then break end
end
return out
"""

# The whole longest-prefix computation server side. KEYS = request keys; ARGV = n tiers, tier names and
# weights, then the allowed pods (none = all). Returns flat [pod, blocks, weighted, ...].
_SCORE = """
local nt = tonumber(ARGV[1])
local w = {}
for i = 1, nt do w[ARGV[1 + i]] = tonumber(ARGV[1 + nt + i]) end
local allowed = nil
if #ARGV > 1 + 2 * nt then
  allowed = {}
  for i = 2 + 2 * nt, #ARGV do allowed[ARGV[i]] = true end
end
local alive = nil
local blocks, weighted = {}, {}
for i = 1, #KEYS do
  local best = {}
  local any = false
  for _, f in ipairs(redis.call('HKEYS', KEYS[i])) do
    local pod, tier = string.match(f, '^(.*)|([^|]*)$')
    if pod and (allowed == nil or allowed[pod]) and (alive == nil or alive[pod]) then
      local wt = w[tier] or 1.0
      if best[pod] == nil or wt > best[pod] then best[pod] = wt end
      any = true
    end
  end
  if not any then break end
  alive = best
  for pod, wt in pairs(best) do
    blocks[pod] = (blocks[pod] or 0) + 1
    weighted[pod] = (weighted[pod] or 0) + wt
  end
end
local out = {}
for pod, b in pairs(blocks) do
  out[#out + 1] = pod
  out[#out + 1] = b
  out[#out + 1] = tostring(weighted[pod])
end
return out
"""


class RedisIndex:
    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379",
        tier_weights: Mapping[str, float] | None = None,
        prefix: str = "pyepp:kv:",
        client: Any = None,
    ) -> None:
        import redis.asyncio as redis

        self.url = url
        self.prefix = prefix
        self.local = MemoryIndex(tier_weights)
        self.local.journal = []
        self.tier_weights = self.local.tier_weights
        self._w = tuple(self.tier_weights[n] for n in TIER_NAMES)
        self.redis = client if client is not None else redis.Redis.from_url(url)
        self._prune = self.redis.register_script(_PRUNE)
        self._apply = self.redis.register_script(_APPLY)
        self._lookup = self.redis.register_script(_LOOKUP)
        self._score = self.redis.register_script(_SCORE)
        self.flush_errors = 0
        self.lookup_timeout = LOOKUP_TIMEOUT
        self.probe_interval = PROBE_INTERVAL
        self.up = True  # the breaker is closed
        self.rebuilds = 0
        self._pending: list[tuple[str, int, str, int]] = []  # changes not yet in Redis, in order
        self._overflowed = False
        self._run_id: str | None = None
        self._probe: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()  # one writer to Redis at a time (flushes and the resync)
        UP.set(1)

    # ------------------------------------------------------------ writes (local, journaled)
    def add(self, engine_keys: Sequence[int] | None, request_keys: Sequence[int], pod: str, tier: int) -> None:
        self.local.add(engine_keys, request_keys, pod, tier)

    def evict(self, engine_keys: Iterable[int], pod: str, tier: int) -> int:
        return self.local.evict(engine_keys, pod, tier)

    def request_key(self, pod: str, engine_key: int) -> int | None:
        return self.local.request_key(pod, engine_key)

    def engine_request_keys(self, pod: str, engine_key: int) -> tuple[int, ...]:
        return self.local.engine_request_keys(pod, engine_key)

    def clear_pod(self, pod: str) -> None:
        self.local.clear_pod(pod)

    def add_speculative(
        self, request_keys: Sequence[int], pod: str, ttl: float, hold: SpeculationHold | None = None
    ) -> None:
        self.local.add_speculative(request_keys, pod, ttl, hold)

    def speculative_only(self, pod: str, request_key: int) -> bool:
        # the local mirror holds this replica's own events: a block another replica ingested reads as speculative
        # (its hit is then not held against the pod)
        return self.local.speculative_only(pod, request_key)

    def pods(self) -> list[str]:
        return self.local.pods()

    def _rkey(self, r: int) -> str:
        return f"{self.prefix}r:{r}"

    def _pkey(self, pod: str) -> str:
        return f"{self.prefix}p:{pod}"

    async def flush(self) -> None:
        """Push the journaled changes in order: one script call per run of adds/removes, clears between. While
        Redis is down they are kept (bounded) for the resync."""
        if self._probe is None:
            self._start_probe()
        j = self.local.journal
        if j:
            self.local.journal = []
            self._keep(j)
        if not self.up or not self._pending:
            return
        async with self._lock:
            batch, self._pending = self._pending, []
            PENDING.set(0)
            try:
                async with asyncio.timeout(FLUSH_TIMEOUT):
                    await self._push(batch)
            except Exception as e:  # the local copy stays right; the shared map is repaired on reconnect
                self.flush_errors += 1
                self._pending = batch + self._pending
                self._trim()
                self._down(f"flush of {len(batch)} changes failed: {e or type(e).__name__}")

    def _keep(self, changes: list[tuple[str, int, str, int]]) -> None:
        self._pending.extend(changes)
        self._trim()

    def _trim(self) -> None:
        if len(self._pending) > MAX_PENDING:
            self._pending = []
            self._overflowed = True
        PENDING.set(len(self._pending))

    async def _push(self, changes: list[tuple[str, int, str, int]]) -> None:
        args: list[Any] = [self.prefix]
        for op, r, pod, tier in changes:
            if op == "clear":
                if len(args) > 1:
                    await self._apply(keys=[], args=args)
                    args = [self.prefix]
                await self._clear_remote(pod)
                continue
            args += (op, r, f"{pod}|{TIER_NAMES[tier]}")
            if len(args) > 30_000:
                await self._apply(keys=[], args=args)
                args = [self.prefix]
        if len(args) > 1:
            await self._apply(keys=[], args=args)

    # ------------------------------------------------------------ the breaker
    def _down(self, why: str) -> None:
        if self.up:
            self.up = False
            UP.set(0)
            STATE_CHANGES.labels("down").inc()
            log.warning(
                "redis index %s unavailable (%s): lookups use this replica's local copy, changes are kept for "
                "when it is back",
                self.url,
                why,
            )
        self._start_probe()

    def _start_probe(self) -> None:
        if self._probe is None or self._probe.done():
            with contextlib.suppress(RuntimeError):  # no running loop: the next flush or lookup starts it
                self._probe = asyncio.get_running_loop().create_task(self._probe_loop())

    async def _server_run_id(self) -> str:
        async with asyncio.timeout(max(self.lookup_timeout * 4, 0.2)):
            info = await self.redis.info("server")
        return str(info.get("run_id", ""))

    async def _probe_loop(self) -> None:
        """While down: ask Redis for its run_id; when it answers, resync and close the breaker. While up: notice a
        restart (a new run_id) even when no request or event has touched Redis since."""
        while True:
            await asyncio.sleep(self.probe_interval)
            try:
                run_id = await self._server_run_id()
            except Exception as e:
                self._down(f"probe failed: {e or type(e).__name__}")
                continue
            restarted = self._run_id is not None and run_id != self._run_id
            if self.up and not restarted:
                self._run_id = run_id
                continue
            try:
                await self._resync(run_id, restarted)
            except Exception as e:
                self._down(f"resync failed: {e or type(e).__name__}")

    async def _resync(self, run_id: str, restarted: bool) -> None:
        async with self._lock:
            if restarted or self._overflowed or self._run_id is None:
                await self._rebuild()
                kind, what = "rebuild", f"rebuilt from the local copy ({len(self.local)} keys)"
            else:
                batch, self._pending = self._pending, []
                await self._push(batch)
                kind, what = "replay", f"{len(batch)} kept changes replayed"
            self._pending, self._overflowed = [], False
            PENDING.set(0)
            self._run_id = run_id
        RESYNCS.labels(kind).inc()
        if not self.up:
            self.up = True
            UP.set(1)
            STATE_CHANGES.labels("up").inc()
        log.warning("redis index %s is back%s: %s", self.url, " (restarted)" if restarted else "", what)

    async def _rebuild(self) -> None:
        """The shared map from the local copy: this replica's pods cleared in Redis, then every entry pushed."""
        self.rebuilds += 1
        self.local.journal = []  # what the copy holds now is what gets pushed
        for pod in self.local.pods():
            await self._clear_remote(pod)
        args: list[Any] = [self.prefix]
        for r, pod, tier in self.local.entries():
            args += ("+", r, f"{pod}|{TIER_NAMES[tier]}")
            if len(args) > 3 * REBUILD_CHUNK:
                await self._apply(keys=[], args=args)
                args = [self.prefix]
                await asyncio.sleep(0)
        if len(args) > 1:
            await self._apply(keys=[], args=args)

    async def _clear_remote(self, pod: str) -> None:
        fields = [f"{pod}|{t}" for t in TIER_NAMES]
        pkey = self._pkey(pod)
        cursor = 0
        while True:
            cursor, members = await self.redis.sscan(pkey, cursor, count=1000)
            if members:
                pipe = self.redis.pipeline(transaction=False)
                for m in members:
                    r = m.decode() if isinstance(m, bytes) else str(m)
                    await self._prune(keys=[f"{self.prefix}r:{r}"], args=fields, client=pipe)
                await pipe.execute()
            if cursor == 0:
                break
        await self.redis.delete(pkey)

    # ------------------------------------------------------------ reads
    async def lookup(self, request_keys: Sequence[int], pods: Iterable[str] | None = None) -> dict[str, PrefixMatch]:
        """Redis's answer within `lookup_timeout`; the local copy's while the breaker is open or when Redis fails."""
        if not request_keys:
            return {}
        if self._probe is None:
            self._start_probe()
        if pods is not None and not isinstance(pods, list | set | frozenset | tuple):
            pods = list(pods)  # read twice when Redis fails
        if not self.up:
            FALLBACK_LOOKUPS.inc()
            return self.local.lookup_now(request_keys, pods)
        try:
            async with asyncio.timeout(self.lookup_timeout):
                return await self._lookup_remote(request_keys, pods)
        except Exception as e:
            self._down(f"lookup failed: {e or type(e).__name__}")
            FALLBACK_LOOKUPS.inc()
            return self.local.lookup_now(request_keys, pods)

    async def _lookup_remote(
        self, request_keys: Sequence[int], pods: Iterable[str] | None = None
    ) -> dict[str, PrefixMatch]:
        allowed = set(pods) if pods is not None else None
        self.local.expire_speculative(time.monotonic())  # drops what is due and carries held entries on
        spec, spec_bits = self.local._spec, self.local._spec_bits
        rkeys = [self._rkey(r) for r in request_keys]
        if not spec_bits or not any(r in spec_bits for r in request_keys):
            names = list(TIER_NAMES)
            args: list[Any] = [len(names), *names, *(self.tier_weights[n] for n in names), *(allowed or ())]
            if allowed is not None and not allowed:
                return {}
            flat = await self._score(keys=rkeys, args=args)
            res: dict[str, PrefixMatch] = {}
            for i in range(0, len(flat), 3):
                pod = flat[i].decode() if isinstance(flat[i], bytes) else str(flat[i])
                res[pod] = PrefixMatch(int(flat[i + 1]), float(flat[i + 2]))
            return res
        rows = [x.split(b"\n") if x else [] for x in await self._lookup(keys=rkeys, args=[])]
        rows += [[]] * (len(request_keys) - len(rows))
        now = time.monotonic()
        by_slot = self.local._by_slot
        alive: set[str] | None = None
        out: dict[str, PrefixMatch] = {}
        for r, fields in zip(request_keys, rows, strict=True):
            best: dict[str, float] = {}
            for f in fields:
                s = f.decode() if isinstance(f, bytes) else str(f)
                pod, _, tname = s.rpartition("|")
                if (allowed is not None and pod not in allowed) or (alive is not None and pod not in alive):
                    continue
                w = self.tier_weights.get(tname, 1.0)
                if w > best.get(pod, -1.0):
                    best[pod] = w
            if r in spec_bits:
                for slot, m in spec.items():
                    exp = m.get(r)
                    if exp is None:
                        continue
                    p = by_slot.get(slot)
                    ok = exp > now and p is not None and (allowed is None or p.name in allowed)
                    if ok and p is not None and (alive is None or p.name in alive):
                        best[p.name] = max(best.get(p.name, -1.0), self._w[TIER_GPU])
            if not best:
                break
            alive = set(best)
            for pod, w in best.items():
                pm = out.get(pod)
                if pm is None:
                    out[pod] = PrefixMatch(1, w)
                else:
                    pm.blocks += 1
                    pm.weighted += w
        return out

    async def entries(self) -> set[tuple[int, str, int]]:
        """Every (request key, pod, tier) in Redis under our prefix (tests; SCAN)."""
        out: set[tuple[int, str, int]] = set()
        async for k in self.redis.scan_iter(match=f"{self.prefix}r:*", count=1000):
            key = k.decode() if isinstance(k, bytes) else str(k)
            r = int(key.rsplit(":", 1)[1])
            for f in await self.redis.hkeys(key):
                s = f.decode() if isinstance(f, bytes) else str(f)
                pod, _, t = s.rpartition("|")
                out.add((r, pod, TIER_NAMES.index(t)))
        return out

    async def close(self) -> None:
        if self._probe is not None:
            self._probe.cancel()
            with contextlib.suppress(BaseException):
                await self._probe
        await self.redis.aclose()
