"""prefill-cost-scorer (pyepp's default scorer): each endpoint costs the work, in prompt tokens, that stands between
this request and its first token there, and the cheapest wins.

    cost(e) = (w(e) + evictionWeight x reuse x full(e)) x uncached(e)
            + backlog(e)                          prefill tokens already routed to e and not yet processed
            + decodeWeight x full(e) x active(e)  KV tokens the requests in flight on e hold (shared blocks once)
            + overflowWeight x max(0, working set(e) - capacity(e))

Why each term: a token e must compute again delays the requests queued behind it too (w(e) falls towards
`idleUncachedWeight` on an idle pod, where only this request waits); a computed token evicts one that will be asked
for again once e's working set outgrows its KV capacity (`full(e)`, `reuse`); the backlog and in-flight terms keep a
cached prefix from pulling every request onto one pod. Without a prefix match every endpoint costs the same
uncached tokens and the scorer balances backlog and decode load. Bookings and releases are shared with the other
EPPs (replicas through the cross-replica syncer, or `--workers`) so each sees the others' picks in its backlogs.
The terms, parameters and their defaults are in docs/plugins.md ("pyepp's default: prefill-cost-scorer").
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections import OrderedDict, _count_elements  # type: ignore[attr-defined]
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Self

from epp.framework import (
    PREFIX_CACHE_MATCH_INFO,
    TOKENIZED_PROMPT,
    CycleState,
    DataKey,
    Endpoint,
    EndpointView,
    InferenceRequest,
    Params,
    Plugin,
    PluginContext,
    RemovalListener,
    SchedulingResult,
    Usage,
)
from epp.plugins.contracts.prefix import PRECISE_MATCH, PRECISE_PREFIX_MATCH, PRECISE_PRODUCER

log = logging.getLogger(__name__)

MAX_SHARED_KEYS = 8192  # block keys per shared booking (a longer prompt shares its first ones)
MAX_REMOTE_BOOKINGS = 1 << 16  # the other replicas' bookings held at most
WORKING_SET_WINDOW = 30.0  # workingSetWindow's default (s)
MAX_WORKING_SET = 1 << 18  # working-set blocks kept per endpoint while its KV capacity is unknown
# a cap on one request's learned decode rate (output tokens/s): a first token estimated late (a prefill faster than
# prefillTokensPerSecond) must not make every decode look instant
MAX_DECODE_TPS = 1000.0


@dataclass(slots=True)
class _Cost:
    """The cost terms computed for this request (kept for pre_request, which books the chosen endpoint)."""

    prompt_tokens: int
    uncached: dict[str, int]


@dataclass(slots=True)
class _InFlight:
    endpoint: str
    tokens: int  # prompt + expected output, less the blocks counted in `keys`
    start: float
    keys: list[int] | None = None  # the prompt's block keys (counted once per endpoint) and their size in tokens
    block_tokens: int = 0
    first_token: float = 0.0  # when its prefill is estimated done (the endpoint's queue drained through it)
    shared_id: int = 0  # the id its booking was shared with the other replicas under (0: not shared)


@dataclass(slots=True)
class _Decaying:
    """A count of events, each weighted e^-(age / window): `decayed(now, window) / window` is their recent rate."""

    value: float = 0.0
    at: float = 0.0

    def decayed(self, now: float, window: float) -> float:
        if now > self.at:
            self.value *= math.exp((self.at - now) / window)
            self.at = now
        return self.value

    def rate(self, now: float, window: float) -> float:
        """The recent rate of the events, per second."""
        return self.decayed(now, window) / window

    def add(self, now: float, window: float) -> None:
        """Count one event now."""
        self.value = self.decayed(now, window) + 1.0


@dataclass(slots=True)
class _Queue:
    busy_until: float = 0.0  # when the endpoint's estimated prefill queue drains
    decode_until: float = 0.0  # when its in-flight requests' decodes are estimated done (decodingEndsFirst)
    active_tokens: int = 0
    active: int = 0
    written: int = 0  # tokens computed there (uncached prompt + output) since this scorer started: fills its KV
    blocks: dict[int, int] = field(default_factory=dict)  # block key -> in-flight requests holding it
    # The working set: prompt block keys routed there within `workingSetWindow`, oldest first (key -> when).
    recent: OrderedDict[int, float] = field(default_factory=OrderedDict)
    recent_block_tokens: int = 0
    traffic: _Decaying = field(default_factory=_Decaying)  # requests routed there (over trafficWindow)


COST = DataKey[_Cost]("prefill-cost")
BOOKED = DataKey[_InFlight]("prefill-cost-booked")  # the request's own booking (x-request-id is the client's)


class PrefillCostScorer(Plugin, RemovalListener):
    type_name = "prefill-cost-scorer"
    records_only = True  # PreRequest writes only the booking on the picked endpoint: may run after the answer

    def __init__(
        self,
        name: str | None = None,
        producer: str = PRECISE_PRODUCER,
        prefill_tokens_per_second: float = 15928.0,
        decode_weight: float = 0.5,
        uncached_weight: float = 2.0,
        default_output_tokens: int = 256,
        request_timeout: float = 300.0,
        eviction_weight: float = 1.0,
        reuse_window: int = 50,
        dedup_in_flight_blocks: bool = False,
        working_set_window: float = 0.0,
        needs_block_keys: bool = False,
        overflow_weight: float = 0.0,
        idle_uncached_weight: float | None = None,
        traffic_window: float = 10.0,
        decoding_share: float = 1.0,
        decoding_ends_first: bool = False,
        sync_cross_replica: bool = True,
    ) -> None:
        super().__init__(name)
        self.producer = producer
        self.info_key = PREFIX_CACHE_MATCH_INFO.of(producer)
        self.cost_key = COST.of(self.name)
        self.booked_key = BOOKED.of(self.name)
        self.rate = prefill_tokens_per_second
        self.decode_weight = decode_weight
        self.uncached_weight = uncached_weight
        self.default_output = default_output_tokens
        self.request_timeout = request_timeout
        self.eviction_weight = eviction_weight
        self.reuse_alpha = 1.0 / max(1, reuse_window)
        self.match_key = PRECISE_MATCH.of(producer)
        self.dedup = dedup_in_flight_blocks
        self.window = working_set_window
        self.needs_block_keys = needs_block_keys
        self.overflow_weight = overflow_weight
        self.idle_weight = uncached_weight if idle_uncached_weight is None else idle_uncached_weight
        self.traffic_window = traffic_window
        self.decoding_share = decoding_share
        self.decoding_ends_first = decoding_ends_first
        self.decode_tps = 0.0  # one request's decode rate (output tokens/s), learned from completions; 0: unknown
        self.reuse = 0.0  # moving average of the share of a prompt's tokens the best pod caches
        self.queues: dict[str, _Queue] = {}
        self._inflight: dict[int, _InFlight] = {}  # id(booking) -> booking
        self._next_sweep = 0.0
        self.sync_cross_replica = sync_cross_replica
        self.endpoints: EndpointView | None = None
        self._send: Callable[[Any], None] | None = None
        self._remote: dict[int, _InFlight] = {}  # the other replicas' bookings, by their shared id
        self.refused = 0

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        producer = context.producer_for(PRECISE_PREFIX_MATCH, params, requested_by=name, add_default=False)
        # The block-key terms (dedupInFlightBlocks, workingSetWindow) read the precise producer's keys: turned on
        # with another prefix producer they would never take effect, so the config is refused.
        dedup = params.bool("dedupInFlightBlocks", True)
        window = params.duration("workingSetWindow", WORKING_SET_WINDOW)
        explicit = (dedup and params.has("dedupInFlightBlocks")) or (window > 0 and params.has("workingSetWindow"))
        uncached_weight = params.float("uncachedWeight", 2.0, min=0.0)
        traffic_window = params.duration("trafficWindow", 10.0)
        if traffic_window <= 0:
            raise params.fail("trafficWindow", "must be a positive duration (the request rate is averaged over it)")
        # the overflow is the working set's: without a window it would never be charged
        overflow = params.float("overflowWeight", 1.0, min=0.0)
        if overflow > 0 and window <= 0 and params.has("overflowWeight"):
            raise params.fail("overflowWeight", "needs workingSetWindow (the working set whose overflow it charges)")
        scorer = cls(
            name,
            producer=producer,
            prefill_tokens_per_second=params.float("prefillTokensPerSecond", 15928.0, min=1.0),
            decode_weight=params.float("decodeWeight", 0.5, min=0.0),
            uncached_weight=uncached_weight,
            default_output_tokens=params.int("defaultOutputTokens", 256, min=0),
            request_timeout=params.duration("requestTimeout", 300.0),
            eviction_weight=params.float("evictionWeight", 1.0, min=0.0),
            reuse_window=params.int("reuseWindow", 50, min=1),
            dedup_in_flight_blocks=dedup,
            working_set_window=window,
            needs_block_keys=explicit,
            overflow_weight=overflow,
            idle_uncached_weight=params.float("idleUncachedWeight", 1.0, min=0.0),
            traffic_window=traffic_window,
            decoding_share=params.float("decodingShare", 0.0, min=0.0, max=1.0),
            decoding_ends_first=params.bool("decodingEndsFirst", True),
            sync_cross_replica=params.bool("syncCrossReplicaState", True),
        )
        context.endpoints.subscribe(scorer)
        scorer.endpoints = context.endpoints
        return scorer

    # Datastore listener: what is tracked for an endpoint goes when it leaves (one that returns under the same name,
    # a StatefulSet's restart, is an empty engine).
    def endpoint_removed(self, endpoint: Endpoint) -> None:
        if self.queues.pop(endpoint.name, None) is not None:
            for rid in [rid for rid, e in self._inflight.items() if e.endpoint == endpoint.name]:
                del self._inflight[rid]
            for sid in [sid for sid, e in self._remote.items() if e.endpoint == endpoint.name]:
                del self._remote[sid]

    def consumes(self) -> Collection[DataKey[Any]]:
        # dedupInFlightBlocks and workingSetWindow read the precise producer's block keys: a config naming another
        # producer is refused (the parameters would never take effect)
        keys: tuple[DataKey[Any], ...] = (self.info_key, TOKENIZED_PROMPT)
        uses_keys = self.dedup or self.window > 0
        return (*keys, self.match_key) if self.needs_block_keys and uses_keys else keys

    # --- scoring ----------------------------------------------------------------------------------------
    def costs(self, request: InferenceRequest, endpoints: Sequence[Endpoint], now: float) -> list[float]:
        """The cost of each endpoint in tokens (and the terms kept for pre_request)."""
        info = request.data.get(self.info_key)
        prompt = request.data.get(TOKENIZED_PROMPT)
        if prompt is not None:
            n = len(prompt.token_ids)
        elif info is not None:
            n = info.total_blocks * info.block_size_tokens
        else:
            n = 0
        matches = info.matches if info is not None else {}
        bs = info.block_size_tokens if info is not None else 0
        uncached: dict[str, int] = {}
        out: list[float] = []
        rate, dw, uw, queues = self.rate, self.decode_weight, self.uncached_weight, self.queues
        ds = self.decoding_share
        evict = self.eviction_weight * self.reuse
        best = 0
        for ep in endpoints:
            u = max(0, n - int(matches.get(ep.name, 0) * bs))
            uncached[ep.name] = u
            best = max(best, n - u)
            q = queues.get(ep.name)
            full = self.fullness(ep, q, now)
            w = uw
            if self.idle_weight != uw:
                idle = self._idle(q, now)
                # decodingShare < 1: an endpoint that only decodes (no prefill queued) and holds part of this prompt
                # is discounted like an idle one, its share no lower than that (its running requests are slowed, not
                # queued); with decodingEndsFirst only if those decodes end before this prefill there would
                if idle or (
                    ds < 1.0
                    and q is not None
                    and u < n
                    and q.busy_until <= now
                    and (not self.decoding_ends_first or q.decode_until <= now + u / rate)
                ):
                    share = self._busy_share(q, full, u, now)
                    if not idle:
                        share = max(share, ds)
                    w = self.idle_weight + (uw - self.idle_weight) * share
            cost = (w + evict * full) * u
            if q is not None:
                if q.busy_until > now:
                    cost += (q.busy_until - now) * rate
                cost += dw * full * q.active_tokens
                if self.overflow_weight > 0 and q.recent_block_tokens:
                    capacity = ep.metrics.kv_capacity_tokens
                    over = len(q.recent) * q.recent_block_tokens - capacity
                    if capacity > 0 and over > 0:
                        cost += self.overflow_weight * over
            out.append(cost)
        if n > 0:
            self.reuse += self.reuse_alpha * (best / n - self.reuse)
        request.data.put(self.cost_key, _Cost(n, uncached))
        return out

    def fullness(self, ep: Endpoint, q: _Queue | None, now: float) -> float:
        """KV pressure on `ep`, 0..1, against its KV capacity (1 when the capacity is unknown): the working set
        (distinct prompt blocks routed there within the window) when it is tracked, else every token written
        there since start, which reads 1 once the pod has been warm for a while."""
        capacity = ep.metrics.kv_capacity_tokens
        if capacity <= 0:
            return 1.0
        if q is None:
            return 0.0
        if q.recent_block_tokens:
            self._expire(q, now, capacity)
            return min(1.0, len(q.recent) * q.recent_block_tokens / capacity)
        return min(1.0, q.written / capacity)

    def _busy_share(self, q: _Queue | None, full: float, uncached: int, now: float) -> float:
        """How far an idle endpoint is from free for a recompute of `uncached` tokens, 0..1: its KV pressure, or
        the requests of its own expected to arrive while the prefill runs (they would queue behind it), whichever is
        larger."""
        if q is None or q.traffic.value <= 0:
            return full
        arrivals = q.traffic.rate(now, self.traffic_window) * uncached / self.rate
        return min(1.0, max(full, arrivals / 2))

    @staticmethod
    def _idle(q: _Queue | None, now: float) -> bool:
        return q is None or (q.active == 0 and q.busy_until <= now)

    def _expire(self, q: _Queue, now: float, capacity: int) -> None:
        """Drop working-set entries older than the window, and beyond twice the capacity (a bound on memory;
        `MAX_WORKING_SET` blocks while the capacity is unknown)."""
        recent, cutoff = q.recent, now - self.window
        limit = 2 * capacity // q.recent_block_tokens + 1 if capacity > 0 else MAX_WORKING_SET
        while recent and (len(recent) > limit or recent[next(iter(recent))] < cutoff):
            recent.popitem(last=False)

    def score(self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[float]:
        costs = self.costs(request, endpoints, time.monotonic())
        if not costs:
            return []
        lo, hi = min(costs), max(costs)
        if hi <= lo:
            return [1.0] * len(costs)
        span = hi - lo
        return [(hi - c) / span for c in costs]

    # --- bookkeeping ------------------------------------------------------------------------------------
    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        targets = result.targets
        cost = request.data.get(self.cost_key)
        if not targets or cost is None:
            return
        now = time.monotonic()
        if now >= self._next_sweep:
            self._sweep(now)
        prev = request.data.pop(self.booked_key)
        if prev is not None and self._inflight.pop(id(prev), None) is not None:
            self._release(prev)
            self._share_release(prev, 0.0)
        name = targets[0].name
        uncached = cost.uncached.get(name, cost.prompt_tokens)
        out = request.max_tokens if request.max_tokens is not None else self.default_output
        match = request.data.get(self.match_key)
        keys, bs = (match.keys, match.block_size) if match is not None and match.block_size > 0 else (None, 0)
        if not keys:
            keys, bs = None, 0
        entry = self._book(name, uncached, cost.prompt_tokens, max(0, out), keys, bs, targets[0], now)
        self._inflight[id(entry)] = entry
        request.data.put(self.booked_key, entry)
        if self._send is not None:
            entry.shared_id = random.getrandbits(62) | 1
            shared = keys[:MAX_SHARED_KEYS] if keys else []
            self._send([entry.shared_id, name, uncached, cost.prompt_tokens, max(0, out), bs, shared])

    def _book(
        self,
        name: str,
        uncached: int,
        prompt_tokens: int,
        out: int,
        keys: Sequence[int] | None,
        bs: int,
        target: Endpoint | None,
        now: float,
    ) -> _InFlight:
        """Book a request on `name`: its prefill joins the queue, its KV the in-flight tokens, its blocks the working
        set. The same for this replica's picks and the others' (`cross_replica_receive`)."""
        q = self.queues.setdefault(name, _Queue())
        q.busy_until = max(q.busy_until, now) + uncached / self.rate
        if self.idle_weight != self.uncached_weight:  # the rate's only reader
            q.traffic.add(now, self.traffic_window)
        entry = _InFlight(name, prompt_tokens + out, now, first_token=q.busy_until)
        if self.decoding_ends_first:
            ends = q.busy_until + out / self.decode_tps if self.decode_tps > 0 else math.inf
            q.decode_until = ends if q.active == 0 else max(q.decode_until, ends)
        if self.window > 0 and keys:
            recent = q.recent
            q.recent_block_tokens = bs
            for k in keys:
                if k in recent:
                    recent.move_to_end(k)
                recent[k] = now
            self._expire(q, now, target.metrics.kv_capacity_tokens if target is not None else 0)
        if self.dedup and keys:
            # the prompt's full blocks count once per endpoint however many in-flight requests share them
            entry.keys, entry.block_tokens = list(keys), bs
            entry.tokens -= len(keys) * bs
            held = q.blocks
            before = len(held)
            _count_elements(held, keys)  # held[k] += 1 for each key, at C speed
            q.active_tokens += (len(held) - before) * bs  # the keys no in-flight request held yet
        q.active_tokens += entry.tokens
        q.active += 1
        q.written += uncached + out
        return entry

    def response_complete(self, request: InferenceRequest, endpoint: Endpoint | None, usage: Usage | None) -> None:
        entry = request.data.pop(self.booked_key)
        if entry is not None and self._inflight.pop(id(entry), None) is not None:
            self._release(entry)
            sample = 0.0
            if self.decoding_ends_first and usage is not None and usage.completion_tokens > 1:
                took = time.monotonic() - entry.first_token
                if took > 0:
                    sample = min(MAX_DECODE_TPS, (usage.completion_tokens - 1) / took)
                    self._learn_decode(sample)
            self._share_release(entry, sample)

    def _learn_decode(self, sample: float) -> None:
        self.decode_tps = sample if self.decode_tps <= 0 else self.decode_tps + 0.1 * (sample - self.decode_tps)

    def _share_release(self, entry: _InFlight, decode_tps: float) -> None:
        if self._send is not None and entry.shared_id:
            self._send([entry.shared_id, round(decode_tps, 3)])

    # --- the other replicas' (or workers') bookings -------------------------------------------------------------
    def cross_replica_channel(self) -> str | None:
        return f"prefill-cost:{self.name}" if self.sync_cross_replica else None

    def cross_replica_connect(self, send: Callable[[Any], None]) -> None:
        self._send = send

    def cross_replica_receive(self, message: Any) -> None:
        """Another replica's booking, [id, endpoint, uncached, prompt tokens, output tokens, block size, [block keys]],
        booked here as if this replica had made it, or its release, [id, decode tokens/s learned or 0]. Anything else,
        or a booking for an endpoint not in the pool, is refused (counted)."""
        now = time.monotonic()
        if now >= self._next_sweep:
            self._sweep(now)
        if isinstance(message, list) and len(message) == 2:
            sid, tps = message
            entry = self._remote.pop(sid, None) if type(sid) is int else None
            if entry is not None:
                self._release(entry)
                if isinstance(tps, int | float) and not isinstance(tps, bool) and 0 < tps <= MAX_DECODE_TPS:
                    self._learn_decode(float(tps))
            return
        booking = _shared_booking(message)
        ep = self.endpoints.get(booking[1]) if booking is not None and self.endpoints is not None else None
        if booking is None or ep is None or len(self._remote) >= MAX_REMOTE_BOOKINGS:
            self.refused += 1
            if self.refused == 1 or self.refused % 1000 == 0:
                log.warning("%s: refused a booking from another replica (%d so far)", self.name, self.refused)
            return
        sid, name, uncached, prompt_tokens, out, bs, keys = booking
        prev = self._remote.pop(sid, None)
        if prev is not None:
            self._release(prev)
        self._remote[sid] = self._book(name, uncached, prompt_tokens, out, keys or None, bs, ep, now)

    def cross_replica_reset(self) -> None:
        """The link to the other replicas is lost: their bookings are dropped (no release would come for them)."""
        for entry in self._remote.values():
            self._release(entry)
        self._remote.clear()

    def _release(self, entry: _InFlight) -> None:
        q = self.queues.get(entry.endpoint)
        if q is None:
            return
        freed = entry.tokens
        if entry.keys:
            held = q.blocks
            for k in entry.keys:
                c = held.get(k, 0)
                if c <= 1:
                    held.pop(k, None)
                    freed += entry.block_tokens
                else:
                    held[k] = c - 1
        q.active_tokens = max(0, q.active_tokens - freed)
        q.active = max(0, q.active - 1)

    def _sweep(self, now: float) -> None:
        self._next_sweep = now + max(1.0, self.request_timeout / 10)
        if self.request_timeout <= 0:
            return
        cutoff = now - self.request_timeout
        for table in (self._inflight, self._remote):
            for rid, entry in list(table.items()):
                if entry.start < cutoff:
                    del table[rid]
                    self._release(entry)


def _shared_booking(message: Any) -> tuple[int, str, int, int, int, int, list[int]] | None:
    """[id, endpoint, uncached, prompt tokens, output tokens, block size, keys] checked: bounded ints, a name, at most
    MAX_SHARED_KEYS int keys."""
    if not isinstance(message, list) or len(message) != 7:
        return None
    sid, name, uncached, prompt, out, bs, keys = message
    if not isinstance(name, str) or not 0 < len(name) <= 300:
        return None
    if not all(type(v) is int and 0 <= v < 1 << 40 for v in (uncached, prompt, out, bs)) or type(sid) is not int:
        return None
    if not isinstance(keys, list) or len(keys) > MAX_SHARED_KEYS or (keys and bs <= 0):
        return None
    if not all(type(k) is int and 0 <= k < 1 << 64 for k in keys):
        return None
    return sid, name, uncached, prompt, out, bs, keys
