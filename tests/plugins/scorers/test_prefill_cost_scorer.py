"""prefill-cost-scorer: uncached prompt tokens + the estimated prefill backlog + a share of in-flight tokens."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from epp.framework import (
    PREFIX_CACHE_MATCH_INFO,
    TOKENIZED_PROMPT,
    ApiKind,
    CycleState,
    Endpoint,
    InferenceRequest,
    PluginConfigError,
    PrefixCacheMatchInfo,
    ProfileResult,
    SchedulingResult,
    TokenizedPrompt,
    Usage,
)
from epp.plugins.contracts.prefix import PRECISE_MATCH, PreciseMatch
from epp.plugins.scorers.prefill_cost_scorer import PrefillCostScorer, _Queue
from tests.helpers import build

KEY = PREFIX_CACHE_MATCH_INFO.of("precise-prefix-cache-producer")
# KV pressure from every token written since start, every endpoint charged uncachedWeight (the defaults until the
# working-set and idle terms): for the tests of those terms alone
WRITTEN = {"workingSetWindow": 0, "idleUncachedWeight": 2}
S = CycleState()


def eps() -> list[Endpoint]:
    return [Endpoint("a", "10.0.0.1", 8000), Endpoint("b", "10.0.0.2", 8000), Endpoint("c", "10.0.0.3", 8000)]


def req(rid: str, n_tokens: int, matches: dict[str, float], max_tokens: int = 10) -> InferenceRequest:
    r = InferenceRequest(rid, "/v1/completions", ApiKind.COMPLETIONS, "m", "m", {}, max_tokens=max_tokens)
    r.data.put(TOKENIZED_PROMPT, TokenizedPrompt(list(range(n_tokens))))
    r.data.put(KEY, PrefixCacheMatchInfo(total_blocks=n_tokens // 16, block_size_tokens=16, matches=matches))
    return r


def pick(scorer: PrefillCostScorer, r: InferenceRequest, endpoints: list[Endpoint]) -> Endpoint:
    scores = scorer.score(S, r, endpoints)
    best = endpoints[max(range(len(endpoints)), key=lambda i: scores[i])]
    scorer.pre_request(r, SchedulingResult({"default": ProfileResult([best])}, "default"))
    return best


def test_cost_is_uncached_tokens_when_idle() -> None:
    s = build(PrefillCostScorer, {"prefillTokensPerSecond": 1000, "uncachedWeight": 1})
    r = req("r1", 1024, {"a": 48, "b": 16})  # a holds 768 tokens, b 256, c none
    assert s.costs(r, eps(), now=0.0) == [256.0, 768.0, 1024.0]
    assert build(PrefillCostScorer, {"uncachedWeight": 2}).costs(r, eps(), now=0.0) == [512.0, 1536.0, 2048.0]
    assert s.score(S, r, eps()) == [1.0, pytest.approx(256 / 768), 0.0]


def test_backlog_moves_work_off_a_busy_cached_pod_and_drains() -> None:
    s = build(
        PrefillCostScorer,
        {
            "prefillTokensPerSecond": 1000,
            "decodeWeight": 0,
            "uncachedWeight": 1,
            "evictionWeight": 0,
        },
    )
    e = eps()
    # three cold 2000-token prompts in a row: each goes where no prefill is queued
    chosen = [pick(s, req(f"cold{i}", 2000, {}), e).name for i in range(3)]
    assert sorted(chosen) == ["a", "b", "c"]
    # a prompt cached on a (1800 of 2000 tokens): every pod has the same backlog, so the cache wins
    assert pick(s, req("warm", 2000, {"a": 112.5}), e).name == "a"
    # now a's queue is longer than b's and c's by the 200 tokens it took: a long cached prefix still wins
    assert pick(s, req("warm2", 2000, {"a": 112.5}), e).name == "a"
    # a short cached prefix does not pay for the queue: 2000 tokens cost less on an emptier pod
    assert pick(s, req("other", 2000, {"a": 2}), e).name in ("b", "c")
    # the queues drain at prefillTokensPerSecond: once they are empty, cost is uncached tokens again
    now = max(q.busy_until for q in s.queues.values()) + 0.01
    assert s.costs(req("later", 2000, {"b": 100}), e, now=now) == [2000.0, 400.0, 2000.0]


def test_in_flight_tokens_count_until_the_response_completes() -> None:
    s = build(PrefillCostScorer, {"prefillTokensPerSecond": 1e9, "decodeWeight": 0.5, "uncachedWeight": 1})
    e = eps()
    r = req("r1", 1000, {}, max_tokens=200)
    assert pick(s, r, e).name == "a"
    later = 1e12  # long after any prefill
    assert s.costs(req("q", 1000, {}), e, now=later) == [1000.0 + 0.5 * 1200, 1000.0, 1000.0]
    s.response_complete(r, e[0], None)
    assert s.costs(req("q", 1000, {}), e, now=later) == [1000.0, 1000.0, 1000.0]
    s.response_complete(r, e[0], None)  # a second completion of the same request changes nothing
    assert s.queues["a"].active == 0


def test_a_second_request_with_the_same_request_id_does_not_release_the_first() -> None:
    """x-request-id is the client's: two requests in flight under one id are two requests, each booked and released
    on its own (a retry of the same request, scheduled again, still replaces its own booking)."""
    s = build(PrefillCostScorer, {"prefillTokensPerSecond": 1e9, "decodeWeight": 1, "uncachedWeight": 1})
    e = eps()
    first, second = req("dup", 1000, {}, max_tokens=0), req("dup", 1000, {}, max_tokens=0)
    assert pick(s, first, e).name == "a"
    assert pick(s, second, e).name == "b"  # a carries the first one's 1000 tokens
    assert (s.queues["a"].active, s.queues["a"].active_tokens) == (1, 1000)
    assert (s.queues["b"].active, s.queues["b"].active_tokens) == (1, 1000)
    s.response_complete(first, e[0], None)
    assert (s.queues["a"].active, s.queues["b"].active) == (0, 1)
    s.pre_request(second, SchedulingResult({"default": ProfileResult([e[2]])}, "default"))  # rescheduled to c
    assert (s.queues["b"].active, s.queues["c"].active) == (0, 1)
    s.response_complete(second, e[2], None)
    assert [q.active_tokens for q in s.queues.values()] == [0, 0, 0]


def test_lost_completions_time_out() -> None:
    s = build(PrefillCostScorer, {"requestTimeout": "1s", "decodeWeight": 1})
    e = eps()
    pick(s, req("lost", 100, {}), e)
    assert s.queues["a"].active == 1
    s._sweep(now=10**9)
    assert s.queues["a"].active == 0 and s.queues["a"].active_tokens == 0


def test_without_a_match_or_tokens_it_balances_load() -> None:
    s = build(PrefillCostScorer, {"decodeWeight": 1})
    e = eps()
    bare = InferenceRequest("x", "/v1/completions", ApiKind.COMPLETIONS, "m", "m", {}, max_tokens=5)
    assert s.score(S, bare, e) == [1.0, 1.0, 1.0]
    s.pre_request(bare, SchedulingResult({"default": ProfileResult([e[1]])}, "default"))
    assert s.score(S, InferenceRequest("y", "/", ApiKind.COMPLETIONS, "m", "m", {}), e) == [1.0, 0.0, 1.0]


def test_parameters_are_checked() -> None:
    with pytest.raises(PluginConfigError):
        build(PrefillCostScorer, {"prefillTokensPerSecond": 0})
    with pytest.raises(PluginConfigError):
        build(PrefillCostScorer, {"decodeWeight": -1})
    s = build(PrefillCostScorer, {"prefixMatchInfoProducerName": "mine", "defaultOutputTokens": 7})
    assert s.info_key == PREFIX_CACHE_MATCH_INFO.of("mine") and s.default_output == 7


def with_capacity(endpoints: list[Endpoint], tokens: int, block: int = 16) -> list[Endpoint]:
    for e in endpoints:
        e.metrics.cache_num_blocks, e.metrics.cache_block_size = tokens // block, block
    return endpoints


def test_kv_pressure_is_the_share_of_capacity_written_there() -> None:
    s = build(PrefillCostScorer, {"prefillTokensPerSecond": 1e9, "decodeWeight": 1, "evictionWeight": 0, **WRITTEN})
    e = with_capacity(eps(), 4000)
    r = req("r1", 1000, {}, max_tokens=1000)  # writes 2000 tokens on a: half its KV
    assert pick(s, r, e).name == "a"
    assert s.fullness(e[0], s.queues.get("a"), 0.0) == 0.5 and s.fullness(e[1], s.queues.get("b"), 0.0) == 0.0
    # in-flight tokens cost in proportion to the pressure: 0.5 x 2000 on a
    assert s.costs(req("q", 1000, {}), e, now=1e12) == [2000.0 + 1000.0, 2000.0, 2000.0]
    s.response_complete(r, e[0], None)
    pick(s, req("r2", 2000, {"a": 125}), e)  # nothing uncached on a: only its 10 output tokens are written
    assert s.queues["a"].written == 2010
    # an unknown capacity (no vllm:cache_config_info) counts as full: the in-flight tokens cost in full
    assert s.fullness(eps()[0], None, 0.0) == 1.0


def test_a_full_cache_charges_the_expected_recompute_of_what_it_evicts() -> None:
    s = build(PrefillCostScorer, {"prefillTokensPerSecond": 1e9, "decodeWeight": 0, "evictionWeight": 1, **WRITTEN})
    e = with_capacity(eps(), 1000)
    for i in range(3):  # every prompt is fully cached on a: the pool's reuse moves towards 1
        s.costs(req(f"hot{i}", 1024, {"a": 64}), e, now=0.0)
    assert s.reuse == pytest.approx(1 - (1 - 1 / 50) ** 3)
    s.queues["b"] = _Queue(written=1000)  # b is full: what it computes evicts cached tokens that get reused
    s.queues["c"] = _Queue(written=0)  # c has free KV: it evicts nothing
    reuse = s.reuse
    cost = s.costs(req("cold", 1024, {}), e, now=0.0)
    assert cost[1] == pytest.approx((2 + reuse) * 1024) and cost[2] == 2 * 1024
    # a workload without reuse charges no eviction, however full the cache
    fresh = build(PrefillCostScorer, {"evictionWeight": 1, **WRITTEN})
    fresh.queues["b"] = _Queue(written=1000)
    assert fresh.costs(req("x", 1024, {}), e, now=0.0) == [2048.0, 2048.0, 2048.0]


MATCH = PRECISE_MATCH.of("precise-prefix-cache-producer")


def keyed(
    rid: str, keys: list[int], matches: dict[str, float], extra: int = 0, max_tokens: int = 8
) -> InferenceRequest:
    """A request whose prompt is `keys` (16-token blocks, as the precise producer hashes them) + `extra` tokens."""
    r = req(rid, len(keys) * 16 + extra, matches, max_tokens=max_tokens)
    r.data.put(MATCH, PreciseMatch(total_blocks=len(keys), block_size=16, keys=keys))
    return r


def place(scorer: PrefillCostScorer, r: InferenceRequest, endpoints: list[Endpoint], i: int) -> None:
    """Score `r`, then book it on endpoints[i] whatever the scores (another plugin's choice)."""
    scorer.score(S, r, endpoints)
    scorer.pre_request(r, SchedulingResult({"default": ProfileResult([endpoints[i]])}, "default"))


def test_in_flight_blocks_shared_by_several_requests_count_once() -> None:
    s = build(PrefillCostScorer, {"prefillTokensPerSecond": 1e9, "dedupInFlightBlocks": True})
    e = eps()
    prefix = list(range(64))  # a 1024-token system prompt: 64 blocks
    a, b = keyed("a1", [*prefix, 1001, 1002], {}, extra=5), keyed("a2", [*prefix, 2001, 2002], {"a": 64}, extra=5)
    assert pick(s, a, e).name == "a"
    assert pick(s, b, e).name == "a"
    # 64 shared + 2 x 2 private blocks, + 2 x (5 tokens past the last full block + 8 output tokens)
    assert s.queues["a"].active_tokens == (64 + 4) * 16 + 2 * 13
    s.response_complete(a, e[0], None)  # the prefix is still held by the other request
    assert s.queues["a"].active_tokens == (64 + 2) * 16 + 13
    s.response_complete(b, e[0], None)
    assert s.queues["a"].active_tokens == 0 and not s.queues["a"].blocks
    # off: every request's whole prompt (and requests without block keys count so too)
    old = build(PrefillCostScorer, {"prefillTokensPerSecond": 1e9, "dedupInFlightBlocks": False})
    pick(old, keyed("a1", [*prefix, 1001, 1002], {}, extra=5), e)
    pick(old, keyed("a2", [*prefix, 2001, 2002], {"a": 64}, extra=5), e)
    assert old.queues["a"].active_tokens == 2 * (66 * 16 + 13)


def test_a_group_stays_on_the_pod_caching_its_prefix_while_its_requests_are_in_flight() -> None:
    """make demo's overload: five requests of one group in flight on the pod caching their 1024-token prefix, an
    idle pod without it. Charging the prefix once per request (5 x 1088 tokens) moved the sixth request to the idle
    pod to recompute the prefix there; counted once, the cached pod stays the cheaper."""
    prefix = list(range(64))
    for dedup, expected in ((True, "a"), (False, "b")):
        s = build(PrefillCostScorer, {"prefillTokensPerSecond": 1e9, "dedupInFlightBlocks": dedup})
        e = eps()[:2]  # capacity unknown: KV counts as full, in-flight tokens cost in full
        for i in range(5):
            place(s, keyed(f"g{i}", [*prefix, 100 + i], {"a": 64}), e, 0)
        assert pick(s, keyed("g5", [*prefix, 200], {"a": 64}), e).name == expected


def test_private_blocks_of_in_flight_requests_count_in_full() -> None:
    """Chat sessions sharing only a system prompt: each in-flight session's own history is KV the pod holds for it,
    so a pod with many sessions in flight stays more expensive (sessions do not pile onto one pod)."""
    s = build(PrefillCostScorer, {"prefillTokensPerSecond": 1e9, "dedupInFlightBlocks": True})
    e = eps()[:2]
    system = list(range(32))
    for i in range(4):  # four sessions in flight on a, each with 30 blocks of its own history
        place(s, keyed(f"s{i}", [*system, *range(1000 * (i + 1), 1000 * (i + 1) + 30)], {"a": 62}, max_tokens=0), e, 0)
    assert s.queues["a"].active_tokens == (32 + 4 * 30) * 16
    # a new session (system prompt + one user turn) goes to b, where nothing is in flight, though only a caches it
    assert pick(s, keyed("new", [*system, 9000, 9001], {"a": 32}, max_tokens=0), e).name == "b"


def test_working_set_is_the_distinct_blocks_routed_there_within_the_window() -> None:
    s = build(PrefillCostScorer, {"prefillTokensPerSecond": 1e9, "workingSetWindow": "30s"})
    e = with_capacity(eps(), 64 * 16)  # 64 blocks
    place(s, keyed("r1", list(range(16)), {}), e, 0)
    place(s, keyed("r2", list(range(8, 24)), {"a": 8}), e, 0)  # 8 of its 16 blocks already in the working set
    q = s.queues["a"]
    assert len(q.recent) == 24
    assert s.fullness(e[0], q, time.monotonic()) == 24 / 64
    # past the window the blocks are no longer part of the working set
    assert s.fullness(e[0], q, time.monotonic() + 31) == 0.0 and not q.recent
    # at most twice the capacity is kept, oldest first out
    place(s, keyed("big", list(range(1000, 1200)), {}), e, 0)
    assert len(q.recent) == 2 * 64 + 1 and next(iter(q.recent)) == 1200 - 129
    # without the window nothing is tracked: pressure is every token written since start
    old = build(PrefillCostScorer, {"prefillTokensPerSecond": 1e9, "workingSetWindow": 0})
    place(old, keyed("r1", list(range(16)), {}), e, 0)
    assert not old.queues["a"].recent and old.fullness(e[0], old.queues["a"], 0.0) == (256 + 8) / 1024


def test_a_new_session_avoids_the_pod_whose_working_set_fills_its_cache() -> None:
    """Multi-turn chat: both pods cache the shared system prompt; a has the histories of six sessions resident
    between turns (none in flight) filling its KV, b only the system prompt. Every token a new session computes on
    a evicts a history block that its session will ask for again; on b it evicts nothing. Counting tokens written
    since start, both pods read full and the tie went to a."""
    system = list(range(32))
    for window, expected in (("60s", "b"), ("0s", "a")):
        s = build(PrefillCostScorer, {"prefillTokensPerSecond": 1e9, "workingSetWindow": window})
        e = with_capacity(eps()[:2], 256 * 16)  # 256 blocks each
        warm = keyed("warm-b", system, {}, max_tokens=0)
        place(s, warm, e, 1)
        s.response_complete(warm, e[1], None)
        for i in range(6):  # six sessions with 40 blocks of their own each: 32 + 240 blocks on a
            hist = list(range(1000 * (i + 1), 1000 * (i + 1) + 40))
            r = keyed(f"s{i}", [*system, *hist], {"a": 32} if i else {}, max_tokens=0)
            place(s, r, e, 0)
            s.response_complete(r, e[0], None)
        s.queues["a"].written = s.queues["b"].written = 10**9  # warm for a long time
        assert pick(s, keyed("new", [*system, 9000, 9001], {"a": 32, "b": 32}), e).name == expected


def test_working_set_window_is_checked() -> None:
    with pytest.raises(PluginConfigError):
        build(PrefillCostScorer, {"workingSetWindow": "soon"})


def scorer_config(params: str, producer: str = "approx-prefix-cache-producer") -> str:
    """An EndpointPickerConfig whose prefill-cost-scorer reads `producer` (by default the approximate one: no block
    keys), with `params` appended to the scorer's parameters."""
    return (
        f"plugins:\n- type: {producer}\n- type: token-producer\n"
        "- type: prefill-cost-scorer\n"
        f"  parameters: {{prefixMatchInfoProducerName: {producer}{params}}}\n"
        "- type: max-score-picker\n"
        "schedulingProfiles: [{name: default, plugins: [{pluginRef: prefill-cost-scorer}, "
        "{pluginRef: max-score-picker}]}]\n"
    )


def test_dedup_in_flight_blocks_needs_a_producer_of_block_keys() -> None:
    """dedupInFlightBlocks reads the precise producer's block keys: named with another prefix producer it would be
    accepted and never take effect, so the config is refused; with the precise producer it builds."""
    from epp.config import ConfigError, parse_config
    from epp.datalayer.datastore import Datastore
    from epp.wiring import build_pipeline, plugin_context

    dedup = ", dedupInFlightBlocks: true"
    with pytest.raises(ConfigError, match="needs precise-prefix-match/approx-prefix-cache-producer"):
        build_pipeline(parse_config(scorer_config(dedup)), plugin_context(Datastore()))
    precise = scorer_config(dedup, "precise-prefix-cache-producer")
    pipeline = build_pipeline(parse_config(precise), plugin_context(Datastore()))
    assert "prefill-cost-scorer" in pipeline.plugins


def test_an_endpoint_that_leaves_the_pool_starts_afresh_when_it_returns() -> None:
    """What the scorer tracks per endpoint (backlog, in-flight tokens, KV filled) goes when the endpoint leaves: a pod
    that comes back under the same name (a StatefulSet's restart) is an empty engine, and the entries of pods that
    are gone must not pile up."""
    import time

    from epp.datalayer.datastore import Datastore
    from epp.wiring import plugin_context

    ds = Datastore()
    for ep in eps():
        ds.upsert(ep)
    params = {"prefillTokensPerSecond": 1, "uncachedWeight": 1, "evictionWeight": 0}
    s = build(PrefillCostScorer, params, ctx=plugin_context(ds))
    assert pick(s, req("r1", 1024, {"a": 64}), eps()).name == "a"  # a caches it all; its backlog is now 1024 s
    cost = s.costs(req("r2", 1024, {}), eps(), now=time.monotonic())
    assert cost[0] > cost[1] == cost[2]
    ds.remove("a")
    assert "a" not in s.queues
    ds.upsert(Endpoint("a", "10.0.0.9", 8000))
    cost = s.costs(req("r3", 1024, {}), eps(), now=time.monotonic())
    assert cost[0] == cost[1] == cost[2]
    s.response_complete(req("r1", 1024, {}), None, None)  # the request that was in flight there ends: no error
    assert s.queues.get("a") is None or s.queues["a"].active == 0


def test_working_set_window_needs_the_precise_producer() -> None:
    """workingSetWindow reads the precise producer's block keys, like dedupInFlightBlocks: with another prefix
    producer it is refused when turned on, accepted when off (the defaults)."""
    from epp.config import ConfigError, parse_config
    from epp.datalayer.datastore import Datastore
    from epp.wiring import build_pipeline, plugin_context

    build_pipeline(parse_config(scorer_config("")), plugin_context(Datastore()))
    build_pipeline(parse_config(scorer_config(", workingSetWindow: 0")), plugin_context(Datastore()))
    with pytest.raises(ConfigError, match="needs precise-prefix-match/approx-prefix-cache-producer"):
        build_pipeline(parse_config(scorer_config(", workingSetWindow: 10s")), plugin_context(Datastore()))
    s = build(PrefillCostScorer, {})
    assert s.dedup and s.window == 30.0
    assert s.idle_weight == 1.0 and s.overflow_weight == 1.0 and s.traffic_window == 10.0


def test_a_recompute_on_an_idle_endpoint_with_free_kv_costs_the_idle_weight() -> None:
    """Multi-turn chat whose system prompt only a holds: on an idle pod with an empty cache the recompute delays and
    evicts nobody, so it is charged `idleUncachedWeight` per token instead of `uncachedWeight`."""
    params = {"prefillTokensPerSecond": 1000, "decodeWeight": 0, "evictionWeight": 0}
    s = build(PrefillCostScorer, {**params, "idleUncachedWeight": 1})
    e = with_capacity(eps(), 64 * 1024)
    place(s, req("busy", 100, {}, max_tokens=0), e, 0)  # a has a request in flight
    r = req("q", 1000, {})
    now = time.monotonic()
    assert s.costs(r, e, now=now + 10) == [2000.0, 1000.0, 1000.0]  # a busy: uncachedWeight 2; b, c idle: 1
    # with the idle weight at uncachedWeight every endpoint pays it, as before the parameter
    same = build(PrefillCostScorer, {**params, "idleUncachedWeight": 2})
    assert same.costs(r, e, now=now) == [2000.0, 2000.0, 2000.0]


def test_the_idle_discount_shrinks_with_kv_pressure_and_with_the_endpoints_own_traffic() -> None:
    """The demo's overload: b is idle for a moment but holds its own groups and gets requests of its own several
    times a second; a 1000-token recompute there would make the next ones wait, so it costs uncachedWeight."""
    params = {"prefillTokensPerSecond": 1000, "decodeWeight": 0, "evictionWeight": 0,
              "idleUncachedWeight": 1, "trafficWindow": "10s", "workingSetWindow": "60s"}  # fmt: skip
    s = build(PrefillCostScorer, params)
    e = with_capacity(eps(), 128 * 16)  # 128 blocks each
    # KV pressure: b's working set is 96 of its 128 blocks -> weight 1 + (2 - 1) x 0.75
    fill = keyed("fill", list(range(96)), {}, max_tokens=0)
    place(s, fill, e, 1)
    # traffic: 40 requests within the window on c, each keeping it busy a moment
    traffic = [req(f"t{i}", 16, {}, max_tokens=0) for i in range(40)]
    for t in traffic:
        place(s, t, e, 2)
    for done in (fill, *traffic):  # responses complete: b and c are idle
        s.response_complete(done, None, None)
    now = max(q.busy_until for q in s.queues.values()) + 0.001
    r = req("q", 1000, {})
    costs = s.costs(r, e, now=now)
    assert costs[0] == pytest.approx(1000.0)  # a: idle, empty, no traffic
    assert costs[1] == pytest.approx(1750.0, rel=0.01)  # b: idle but 3/4 full
    # c: ~40 requests in 10 s arrive at 4/s; during a 1 s prefill ~4 of them would queue behind it -> full weight
    assert costs[2] == pytest.approx(2000.0, rel=0.01)


def test_a_working_set_beyond_capacity_is_charged_its_overflow() -> None:
    params = {"prefillTokensPerSecond": 1e9, "decodeWeight": 0, "evictionWeight": 0,
              "workingSetWindow": "60s", "idleUncachedWeight": 2}  # fmt: skip
    e = with_capacity(eps(), 64 * 16)  # 64 blocks each
    for weight, extra in ((0, 0.0), (1, 36 * 16.0), (2, 2 * 36 * 16.0)):
        s = build(PrefillCostScorer, {**params, "overflowWeight": weight})
        place(s, keyed("big", list(range(100)), {}, max_tokens=0), e, 0)  # a asked for 100 distinct blocks
        r = keyed("q", list(range(500, 510)), {})
        assert s.costs(r, e, now=time.monotonic()) == [2 * 160.0 + extra, 320.0, 320.0]


def test_overflow_weight_needs_the_working_set() -> None:
    with pytest.raises(PluginConfigError, match=r"overflowWeight.*workingSetWindow"):
        build(PrefillCostScorer, {"overflowWeight": 1, "workingSetWindow": 0})
    build(PrefillCostScorer, {"workingSetWindow": 0})  # the default overflow weight is not an error without it
    with pytest.raises(PluginConfigError):
        build(PrefillCostScorer, {"idleUncachedWeight": -1})
    with pytest.raises(PluginConfigError):
        build(PrefillCostScorer, {"trafficWindow": "fast"})
    with pytest.raises(PluginConfigError, match="trafficWindow"):
        build(PrefillCostScorer, {"trafficWindow": 0})


def test_decoding_share_discounts_a_decoding_endpoint_that_holds_part_of_the_prompt() -> None:
    """Mooncake at 8 pods lost its hits to this: the pod holding part of a prompt had one request decoding and no
    prefill queued, and was charged the busy weight for its recompute, so the prompt was recomputed whole on an idle
    pod. With `decodingShare` such an endpoint is discounted as an idle one, its share no lower than that; a request
    that holds nothing there, or an endpoint with prefill queued, is charged as before."""
    params = {"prefillTokensPerSecond": 1000, "decodeWeight": 0, "evictionWeight": 0,
              "idleUncachedWeight": 1, "trafficWindow": "10s", "decodingEndsFirst": False}  # fmt: skip
    scorers = {share: build(PrefillCostScorer, {**params, "decodingShare": share}) for share in (1.0, 0.5, 0.0)}
    e = with_capacity(eps(), 64 * 1024)
    for s in scorers.values():
        place(s, req("busy", 96, {"a": 6}), e, 0)  # in flight on a, all of it cached: nothing left to prefill
    now = time.monotonic() + 10
    small = req("small", 1000, {"a": 12.5})  # a holds 200 of its 1000 tokens
    assert scorers[1.0].costs(small, e, now=now) == [1600.0, 1000.0, 1000.0]  # the default: the busy weight
    assert scorers[0.5].costs(small, e, now=now) == pytest.approx([1200.0, 1000.0, 1000.0])  # 1 + (2 - 1) x 0.5
    q = scorers[0.0].queues["a"]
    share = scorers[0.0]._busy_share(q, scorers[0.0].fullness(e[0], q, now), 800, now)
    assert 0 < share < 0.05  # a's own arrivals expected during the 0.8 s recompute
    assert scorers[0.0].costs(small, e, now=now) == pytest.approx([(1 + share) * 800, 1000.0, 1000.0])
    # a request that holds nothing on a is charged the busy weight there: a cold prompt stays off decoding pods
    assert scorers[0.0].costs(req("cold", 1000, {}), e, now=now) == [2000.0, 1000.0, 1000.0]
    # prefill queued on a: busy as before
    q.busy_until = now + 1
    assert scorers[0.0].costs(small, e, now=now)[0] == 1600.0 + 1000.0
    with pytest.raises(PluginConfigError, match="decodingShare"):
        build(PrefillCostScorer, {"decodingShare": 1.5})
    default = build(PrefillCostScorer, {})  # the default: any share, once the pod's decodes end first
    assert (default.decoding_share, default.decoding_ends_first) == (0.0, True)


def test_decoding_ends_first_discounts_a_decoding_pod_only_when_its_decodes_end_before_this_prefill() -> None:
    """`decodingEndsFirst`: a pod that holds part of the prompt and only decodes gets the idle discount only if its
    in-flight decodes are expected to end before this request's prefill there would (their max_tokens at the decode
    rate learned from completions); with the rate unknown, or a longer decode, it is charged the busy weight."""
    params = {"prefillTokensPerSecond": 1000, "decodeWeight": 0, "evictionWeight": 0,
              "idleUncachedWeight": 1, "trafficWindow": "10s", "decodingShare": 0,
              "decodingEndsFirst": True}  # fmt: skip
    e = with_capacity(eps(), 64 * 1024)
    small = req("small", 1000, {"a": 12.5})  # a holds 200 of its 1000 tokens: 0.8 s of prefill there

    def learned(after: float = 1.0) -> PrefillCostScorer:
        """A scorer that has seen one completion: 11 tokens, the last 10 `after` seconds after the first."""
        s = build(PrefillCostScorer, params)
        done = req("done", 96, {"c": 6})
        place(s, done, e, 2)
        booked = done.data.get(s.booked_key)
        assert booked is not None
        booked.first_token = time.monotonic() - after
        s.response_complete(done, e[2], Usage(completion_tokens=11))
        return s

    assert learned().decode_tps == pytest.approx(10.0, rel=0.05)
    assert learned(after=1e-6).decode_tps == 1000.0  # capped: a first token estimated late is not an instant decode

    unknown = build(PrefillCostScorer, params)
    place(unknown, req("busy", 96, {"a": 6}, max_tokens=5), e, 0)  # all cached: decoding on a at once
    assert unknown.costs(small, e, now=time.monotonic())[0] == 1600.0  # no rate yet: the busy weight
    short = learned()
    place(short, req("busy", 96, {"a": 6}, max_tokens=5), e, 0)  # 5 tokens at 10/s: done in 0.5 s < 0.8 s
    now = time.monotonic()
    q = short.queues["a"]
    share = short._busy_share(q, short.fullness(e[0], q, now), 800, now)
    assert short.costs(small, e, now=now)[0] == pytest.approx((1 + share) * 800) and share < 0.05
    assert short.costs(req("cold", 1000, {}), e, now=now)[0] == 2000.0  # holds nothing on a: busy weight
    long = learned()
    place(long, req("busy", 96, {"a": 6}, max_tokens=10), e, 0)  # 10 tokens: 1 s, longer than the prefill
    assert long.costs(small, e, now=time.monotonic())[0] == 1600.0
    # without the condition (decodingShare alone) the long decode is discounted too
    plain = build(PrefillCostScorer, {**params, "decodingEndsFirst": False})
    place(plain, req("busy", 96, {"a": 6}, max_tokens=10), e, 0)
    assert plain.costs(small, e, now=time.monotonic())[0] < 1000.0


def linked(params: Mapping[str, object]) -> tuple[PrefillCostScorer, PrefillCostScorer, list[Endpoint]]:
    """Two scorers of one pool (two replicas, or two workers), each one's messages delivered to the other at once."""
    from epp.datalayer.datastore import Datastore
    from epp.wiring.runtime import plugin_context

    store = Datastore()
    e = eps()
    for ep in e:
        store.upsert(ep)
    one, two = (build(PrefillCostScorer, params, ctx=plugin_context(store)) for _ in range(2))
    one.cross_replica_connect(two.cross_replica_receive)
    two.cross_replica_connect(one.cross_replica_receive)
    return one, two, store.endpoints()  # type: ignore[return-value]


def test_another_replicas_booking_is_in_the_backlog_here_and_its_release_frees_it() -> None:
    params = {"prefillTokensPerSecond": 1000, "decodeWeight": 1, "uncachedWeight": 1, "evictionWeight": 0}
    one, two, e = linked(params)
    keys = list(range(1, 65))
    r = keyed("r1", keys, {})
    place(one, r, e, 0)  # replica one books 1024 uncached tokens on a
    qa = two.queues["a"]
    assert qa.active == 1 and qa.busy_until > time.monotonic() + 0.5 and set(qa.blocks) == set(keys)
    # replica two now sends a cold request elsewhere: a's backlog is its own as much as one's
    assert pick(two, keyed("r2", list(range(100, 164)), {}), e).name != "a"
    one.response_complete(r, e[0], Usage(prompt_tokens=1024, completion_tokens=8))
    assert qa.active == 0 and qa.active_tokens == 0 and not qa.blocks and not two._remote


def test_shared_bookings_are_checked_bounded_and_dropped_when_the_link_is_lost() -> None:
    one, two, e = linked({"prefillTokensPerSecond": 1000})
    for bad in ([1, "nowhere:1", 10, 10, 1, 16, []], [1, "a", -1, 10, 1, 16, []], [1, "a", 10, 10, 1, 16, ["x"]],
                [1, "a", 10, 10, 1, 0, [5]], "junk", [True, "a", 1, 1, 1, 16, []]):  # fmt: skip
        two.cross_replica_receive(bad)
    assert two.refused == 6 and not two.queues
    place(one, keyed("r1", [1, 2, 3], {}), e, 1)
    assert two.queues["b"].active == 1
    two.cross_replica_reset()
    assert two.queues["b"].active == 0 and not two._remote


def test_sync_cross_replica_state_false_shares_nothing() -> None:
    s = build(PrefillCostScorer, {"syncCrossReplicaState": False})
    assert s.cross_replica_channel() is None


REMOVED = ("saturationWeight", "coldArrivalWeight", "coldShare", "arrivalWeight", "nextTurnWeight")


@pytest.mark.parametrize("name", REMOVED)
def test_a_removed_parameter_is_an_unknown_parameter_with_its_file_and_line(name: str, tmp_path: Path) -> None:
    """Parameters the workload suite showed no cell needs were deleted: a config still naming one is refused like
    any unknown parameter, with the file and line of the key (not accepted and ignored)."""
    from epp.config import ConfigError, load_config
    from epp.datalayer.datastore import Datastore
    from epp.wiring import build_pipeline, plugin_context

    shipped = Path(__file__).parents[3] / "config" / "pyepp-default.yaml"
    build_pipeline(load_config(shipped), plugin_context(Datastore()))
    anchor = "    prefillTokensPerSecond: 15928\n"
    text = shipped.read_text()
    assert anchor in text
    path = tmp_path / "epp.yaml"
    path.write_text(text.replace(anchor, f"{anchor}    {name}: 1\n"))
    line = path.read_text().splitlines().index(f"    {name}: 1") + 1
    with pytest.raises(ConfigError) as ei:
        build_pipeline(load_config(path), plugin_context(Datastore()))
    expected = f"{path}:{line}: plugins[1].parameters.{name}: prefill-cost-scorer: unknown parameter '{name}'"
    assert str(ei.value).startswith(expected), str(ei.value)
