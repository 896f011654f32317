"""Typed request state: keys by name, per-producer keys, the map's reads and writes."""

from __future__ import annotations

import pytest

from epp.framework import PREFIX_CACHE_MATCH_INFO, CycleState, DataKey, DataMap, PrefixCacheMatchInfo


def test_keys_with_the_same_name_are_the_same_key() -> None:
    assert DataKey[int]("x") == DataKey[int]("x")
    assert hash(DataKey[int]("x")) == hash(DataKey[int]("x"))
    assert DataKey[int]("x") != DataKey[int]("y")
    with pytest.raises(ValueError):
        DataKey[int]("")


def test_per_producer_keys_do_not_collide() -> None:
    a, b = PREFIX_CACHE_MATCH_INFO.of("a"), PREFIX_CACHE_MATCH_INFO.of("b")
    assert a.name == "prefix-cache-match-info/a" and a != b
    m = DataMap()
    m.put(a, PrefixCacheMatchInfo(4, 16, {"pod": 2.0}))
    assert m.get(b) is None
    got = m.get(a)
    assert got is not None and got.matches == {"pod": 2.0}


def test_map_reads_writes_and_missing_keys() -> None:
    k = DataKey[list[int]]("tokens")
    m = DataMap()
    assert m.get(k) is None and k not in m and len(m) == 0
    with pytest.raises(KeyError, match="tokens"):
        m.require(k)
    m.put(k, [1, 2])
    assert k in m and m.require(k) == [1, 2] and m.names() == ["tokens"]
    assert m.pop(k) == [1, 2] and m.pop(k) is None
    other = DataMap({k: [3]})
    m.update(other)
    assert m.get(k) == [3]
    assert "tokens" not in m  # only keys, never raw strings


def test_cycle_state_is_a_separate_map() -> None:
    k = DataKey[int]("n")
    request_data, cycle = DataMap(), CycleState()
    cycle.put(k, 1)
    assert request_data.get(k) is None and cycle.get(k) == 1
