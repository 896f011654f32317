"""inflight-load-producer (llm-d): in-flight requests and tokens per endpoint, counted by this EPP from pick to
response end.

PreRequest adds 1 request and the request's tokens to the primary target of every profile: the prompt tokens not
already cached there (from the prefix producer named by `prefixMatchInfoProducerName`, the approximate one by
default), plus, with `addEstimatedOutputTokens`, an output estimate min(round(input·outputRatio), the client's
max_tokens, maxEstimatedOutputTokens). The first response chunk means prefill is done: without the output estimate
every target's tokens are released then (the `prefill` profile's target is released entirely); with it only the
`prefill` target is. The last chunk (or the end of the stream, however it ends) releases the rest. A request with no
response activity for `stale_after` (5 minutes, the router's PluginState staleness) is reaped, so a lost
completion cannot pin an endpoint. Releases go to the counter object the request incremented, so an endpoint that
left and came back under the same name is not decremented for requests of its earlier life.

Each endpoint carries its live `InFlightLoad` as an attribute (`INFLIGHT_LOAD.of(name)`), which the
token-load-scorer, active-request-scorer, concurrency-detector and prefix-cache-affinity-filter read. Per request,
`prepare` writes the tokens the request would add on each candidate (`UNCACHED_REQUEST_TOKENS.of(name)`). With a
cross-replica syncer configured (`dataLayer.crossReplicaSyncerPluginRef`) the other replicas' counts are added in as
`remote_*` unless `syncCrossReplicaState: false`. Those snapshots are up to one sync interval old, and two replicas
placing cold requests within that interval saw the same idle pod and sent both there (measured: docs/benchmarks.md);
so with a syncer that carries messages each booking is also sent as it is made ([endpoint, tokens]) and added to the
other replicas' `remote_*` at once, until their next snapshot round has had time to include it.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
import weakref
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Self

from prometheus_client.core import REGISTRY, GaugeMetricFamily
from prometheus_client.registry import Collector

from epp.framework import (
    INFLIGHT_LOAD,
    PREFIX_CACHE_MATCH_INFO,
    TOKENIZED_PROMPT,
    UNCACHED_REQUEST_TOKENS,
    DataKey,
    Endpoint,
    InferenceRequest,
    InFlightLoad,
    Params,
    Plugin,
    PluginContext,
    ResponseChunk,
    SchedulingResult,
    Usage,
)
from epp.plugins.contracts.load import INFLIGHT_PRODUCER
from epp.plugins.contracts.prefix import APPROX_PRODUCER, PREFIX_MATCH
from epp.plugins.contracts.prompt import input_tokens

log = logging.getLogger(__name__)

TYPE = INFLIGHT_PRODUCER
MAX_RECENT = 4096  # bookings received from other replicas and not yet covered by a snapshot round
DEFAULT_OUTPUT_RATIO = 1.5
PREFILL_PROFILE = "prefill"
STALE_AFTER_SECONDS = 300.0


@dataclass(slots=True)
class _Entry:
    """One profile target's contribution; zeroed as it is released, so each part is released once."""

    load: InFlightLoad
    profile: str
    tokens: int
    requests: int = 1


@dataclass(slots=True)
class _Tracked:
    entries: list[_Entry]
    last: float
    serial: int = 0
    released: bool = False


_TRACKED = DataKey[_Tracked]("inflight-load-tracked")


class _InFlightCollector(Collector):
    """llm_d_epp_inflight_requests / llm_d_epp_inflight_tokens, read at scrape time (nothing on the hot path)."""

    def __init__(self) -> None:
        self.producers: weakref.WeakSet[InFlightLoadProducer] = weakref.WeakSet()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        labels = ["endpoint_name", "namespace", "producer_name"]
        reqs = GaugeMetricFamily(
            "llm_d_epp_inflight_requests",
            "Current number of in-flight requests per endpoint, as tracked by the in-flight load producer.",
            labels=labels,
        )
        toks = GaugeMetricFamily(
            "llm_d_epp_inflight_tokens",
            "Current number of in-flight tokens per endpoint (uncached prompt tokens, optionally plus estimated "
            "output), as tracked by the in-flight load producer.",
            labels=labels,
        )
        remote_reqs = GaugeMetricFamily(
            "epp_inflight_remote_requests",
            "In-flight requests per endpoint reported by the other EPP replicas (cross-replica sync).",
            labels=labels,
        )
        remote_toks = GaugeMetricFamily(
            "epp_inflight_remote_tokens",
            "In-flight tokens per endpoint reported by the other EPP replicas (cross-replica sync).",
            labels=labels,
        )
        for p in list(self.producers):
            for name, (ns, load) in sorted(p.endpoint_loads().items()):
                reqs.add_metric([name, ns, p.name], load.requests)
                toks.add_metric([name, ns, p.name], load.tokens)
                remote_reqs.add_metric([name, ns, p.name], load.remote_requests)
                remote_toks.add_metric([name, ns, p.name], load.remote_tokens)
        yield reqs
        yield toks
        yield remote_reqs
        yield remote_toks


_COLLECTOR: _InFlightCollector | None = None


def _register(producer: InFlightLoadProducer) -> None:
    global _COLLECTOR
    if _COLLECTOR is None:
        _COLLECTOR = _InFlightCollector()
        REGISTRY.register(_COLLECTOR)
    _COLLECTOR.producers.add(producer)


class InFlightLoadProducer(Plugin):
    type_name = TYPE
    records_only = True  # PreRequest writes only the in-flight booking: may run after the answer

    def __init__(
        self,
        name: str | None = None,
        *,
        add_estimated_output_tokens: bool = False,
        output_ratio: float = DEFAULT_OUTPUT_RATIO,
        max_estimated_output_tokens: int | None = None,
        prefix_producer: str = APPROX_PRODUCER,
        sync_cross_replica_state: bool = True,
        stale_after: float = STALE_AFTER_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(name)
        self.add_output = add_estimated_output_tokens
        self.output_ratio = output_ratio
        self.max_output = max_estimated_output_tokens
        self.prefix_key = PREFIX_CACHE_MATCH_INFO.of(prefix_producer)
        self.key = INFLIGHT_LOAD.of(self.name)
        self.uncached_key = UNCACHED_REQUEST_TOKENS.of(self.name)
        self.sync = sync_cross_replica_state
        self.stale_after = stale_after
        self.clock = clock
        self.loads: dict[str, InFlightLoad] = {}
        self._namespaces: dict[str, str] = {}
        self._live: dict[int, _Tracked] = {}
        self._serial = itertools.count(1)
        self._next_sweep = 0.0
        self._send: Callable[[Any], None] | None = None
        # other replicas' bookings received since the last snapshot rounds: [rounds seen, endpoint, tokens]
        self._recent: list[list[Any]] = []
        self.refused = 0

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        max_out = params.int("maxEstimatedOutputTokens", -1, min=0) if params.has("maxEstimatedOutputTokens") else None
        producer = cls(
            name,
            add_estimated_output_tokens=params.bool("addEstimatedOutputTokens", False),
            output_ratio=params.float("outputRatio", DEFAULT_OUTPUT_RATIO, min=0.0),
            max_estimated_output_tokens=max_out,
            prefix_producer=context.producer_for(PREFIX_MATCH, params, requested_by=name, add_default=False),
            sync_cross_replica_state=params.bool("syncCrossReplicaState", True),
        )
        context.endpoints.subscribe(producer)
        _register(producer)
        return producer

    def produces(self) -> Collection[DataKey[Any]]:
        return (self.key, self.uncached_key)

    def uses(self) -> Collection[DataKey[Any]]:
        return (TOKENIZED_PROMPT, self.prefix_key)

    # -- endpoints: each carries its live counters -------------------------------------------------------------

    def load_for(self, endpoint: Endpoint) -> InFlightLoad:
        load = self.loads.get(endpoint.name)
        if load is None:
            load = self.loads[endpoint.name] = InFlightLoad()
            self._namespaces[endpoint.name] = endpoint.namespace
        if endpoint.attributes.get(self.key) is not load:
            endpoint.attributes.put(self.key, load)
        return load

    def endpoint_added(self, endpoint: Endpoint) -> None:
        self.load_for(endpoint)

    def endpoint_updated(self, endpoint: Endpoint) -> None:
        self.load_for(endpoint)

    def endpoint_removed(self, endpoint: Endpoint) -> None:
        self.loads.pop(endpoint.name, None)
        self._namespaces.pop(endpoint.name, None)

    def endpoint_loads(self) -> dict[str, tuple[str, InFlightLoad]]:
        return {n: (self._namespaces.get(n, ""), load) for n, load in self.loads.items()}

    # -- the request's tokens ----------------------------------------------------------------------------------

    def estimate_output(self, inputs: int, client_max: int | None) -> int:
        if inputs <= 0:
            return 0
        est = math.floor(inputs * self.output_ratio + 0.5)
        if client_max is not None and 0 <= client_max < est:
            est = client_max
        if self.max_output is not None and self.max_output < est:
            est = self.max_output
        return est

    def _request_tokens(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> dict[str, int]:
        inputs = input_tokens(request)
        info = request.data.get(self.prefix_key)
        output = self.estimate_output(inputs, request.max_tokens) if self.add_output else 0
        out: dict[str, int] = {}
        if info is None or info.block_size_tokens <= 0:
            for ep in endpoints:
                out[ep.name] = inputs + output
            return out
        bs = info.block_size_tokens
        indexed = info.total_blocks * bs
        tail = max(0, inputs - indexed)
        matches = info.matches
        for ep in endpoints:
            matched = int(matches.get(ep.name, 0) * bs)
            out[ep.name] = max(0, indexed - matched) + tail + output
        return out

    async def prepare(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> None:
        for ep in endpoints:
            if ep.attributes.get(self.key) is None:
                self.load_for(ep)
        request.data.put(self.uncached_key, self._request_tokens(request, endpoints))

    # -- lifecycle ---------------------------------------------------------------------------------------------

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        now = self.clock()
        if now >= self._next_sweep:
            self.sweep(now)
        previous = request.data.get(_TRACKED)
        if previous is not None:  # scheduled again (a retry through the same stream): drop the earlier booking
            self._release(previous)
        tokens = request.data.get(self.uncached_key) or {}
        entries = []
        for profile, res in result.profile_results.items():
            if res is None or not res.targets:
                continue
            ep = res.targets[0]
            load = self.load_for(ep)
            n = tokens.get(ep.name)
            if n is None:
                n = self._request_tokens(request, [ep])[ep.name]
            load.requests += 1
            load.tokens += n
            entries.append(_Entry(load, profile, n))
            if self._send is not None:
                self._send([ep.name, n])
        if not entries:
            return
        tracked = _Tracked(entries, now, next(self._serial))
        self._live[tracked.serial] = tracked
        request.data.put(_TRACKED, tracked)

    def response_chunk(self, request: InferenceRequest, chunk: ResponseChunk, endpoint: Endpoint | None) -> None:
        tracked = request.data.get(_TRACKED)
        if tracked is None or tracked.released:
            return
        tracked.last = self.clock()
        if chunk.end:
            self._release(tracked)
            return
        if not chunk.first:
            return
        for e in tracked.entries:
            if e.profile == PREFILL_PROFILE:
                _release_entry(e, tokens=True, requests=True)
            elif not self.add_output:
                _release_entry(e, tokens=True, requests=False)

    def response_complete(self, request: InferenceRequest, endpoint: Endpoint | None, usage: Usage | None) -> None:
        tracked = request.data.get(_TRACKED)
        if tracked is not None:
            self._release(tracked)

    def _release(self, tracked: _Tracked) -> None:
        if tracked.released:
            return
        tracked.released = True
        self._live.pop(tracked.serial, None)
        for e in tracked.entries:
            _release_entry(e, tokens=True, requests=True)

    def sweep(self, now: float | None = None) -> int:
        """Reap requests without response activity for `stale_after`; returns how many."""
        now = self.clock() if now is None else now
        self._next_sweep = now + max(0.05, min(60.0, self.stale_after / 5))
        cutoff = now - self.stale_after
        stale = [t for t in self._live.values() if t.last < cutoff]
        for t in stale:
            self._release(t)
        return len(stale)

    def tracked_requests(self) -> int:
        return len(self._live)

    # -- cross-replica state -----------------------------------------------------------------------------------

    def cross_replica_key(self) -> str | None:
        return f"inflight:{self.name}" if self.sync else None

    def cross_replica_snapshot(self) -> dict[str, list[int]]:
        return {n: [load.requests, load.tokens] for n, load in self.loads.items()}

    def cross_replica_update(self, remote: Mapping[str, list[int]]) -> None:
        """A snapshot round: the other replicas' sums, plus the bookings they sent since that the snapshots may not
        hold yet (a booking is counted in the first round after it arrived, and left to the snapshots from the
        second on: by then its sender has published a snapshot taken after it)."""
        for n, load in self.loads.items():
            vals = remote.get(n)
            if vals is None:
                load.remote_requests = load.remote_tokens = 0
            else:
                load.remote_requests = vals[0] if len(vals) > 0 else 0
                load.remote_tokens = vals[1] if len(vals) > 1 else 0
        keep = []
        for booking in self._recent:
            booking[0] += 1
            if booking[0] < 2:
                keep.append(booking)
                booked = self.loads.get(booking[1])
                if booked is not None:
                    booked.remote_requests += 1
                    booked.remote_tokens += booking[2]
        self._recent = keep

    def cross_replica_channel(self) -> str | None:
        return f"inflight:{self.name}" if self.sync else None

    def cross_replica_connect(self, send: Callable[[Any], None]) -> None:
        self._send = send

    def cross_replica_receive(self, message: Any) -> None:
        """Another replica's booking, [endpoint name, tokens]: counted in `remote_*` now, for an endpoint of the
        pool; anything else is refused (counted)."""
        ok = (
            isinstance(message, list)
            and len(message) == 2
            and isinstance(message[0], str)
            and type(message[1]) is int
            and 0 <= message[1] < 1 << 40
        )
        load = self.loads.get(message[0]) if ok else None
        if load is None or len(self._recent) >= MAX_RECENT:
            self.refused += 1
            if self.refused == 1 or self.refused % 1000 == 0:
                log.warning("%s: refused a booking from another replica (%d so far)", self.name, self.refused)
            return
        load.remote_requests += 1
        load.remote_tokens += message[1]
        self._recent.append([0, message[0], message[1]])

    def cross_replica_reset(self) -> None:
        """The bookings received and not yet covered by a snapshot round are dropped (the snapshots are cleared by
        the syncer itself)."""
        for _, name, tokens in self._recent:
            load = self.loads.get(name)
            if load is not None:
                load.remote_requests = max(0, load.remote_requests - 1)
                load.remote_tokens = max(0, load.remote_tokens - tokens)
        self._recent = []


def _release_entry(e: _Entry, *, tokens: bool, requests: bool) -> None:
    load = e.load
    if tokens and e.tokens:
        load.tokens = max(0, load.tokens - e.tokens)
        e.tokens = 0
    if requests and e.requests:
        load.requests = max(0, load.requests - e.requests)
        e.requests = 0


def load_of(endpoint: Endpoint, key: DataKey[InFlightLoad]) -> InFlightLoad | None:
    return endpoint.attributes.get(key)
