"""Params: typed getters whose errors name the plugin, the (dotted) key and its line in the file."""

from __future__ import annotations

import pytest

from epp.config.yamlmarks import load_marked
from epp.framework import Params, PluginConfigError


def test_nested_sections_name_the_dotted_path_and_line() -> None:
    raw = load_marked("kvEventsConfig:\n  topicFilter: kv@\n  concurrency: many\n")
    p = Params("precise", raw)
    kec = p.section("kvEventsConfig")
    assert kec.str("topicFilter", "") == "kv@"
    with pytest.raises(PluginConfigError) as e:
        kec.int("concurrency", 4)
    assert e.value.key == "kvEventsConfig.concurrency" and e.value.line == 3
    assert "precise: parameter 'kvEventsConfig.concurrency': expected an integer, got 'many'" in str(e.value)


def test_quoted_booleans_are_errors_not_true() -> None:
    p = Params("p", {"speculativeIndexing": "false"})
    with pytest.raises(PluginConfigError, match=r"speculativeIndexing.*expected true or false"):
        p.bool("speculativeIndexing", True)


def test_section_must_be_a_mapping_and_unread_keys_are_listed() -> None:
    p = Params("p", {"a": 1, "tokenizer": "qwen"})
    with pytest.raises(PluginConfigError, match="'tokenizer': expected a mapping"):
        p.section("tokenizer")
    assert p.section("absent").raw == {}
    assert p.unread() == ["a"]


def test_a_section_asked_for_twice_is_one_section() -> None:
    """Two readers of one nested mapping (e.g. the KV index and the precise producer, both in `indexerConfig`): a
    key either reads is read."""
    p = Params("p", {"indexerConfig": {"kvBlockIndexConfig": {}, "tokenizersPoolConfig": {}, "other": 1}})
    p.section("indexerConfig").section("kvBlockIndexConfig")
    p.section("indexerConfig").section("tokenizersPoolConfig")
    assert p.section("indexerConfig") is p.section("indexerConfig")
    assert p.unread() == ["indexerConfig.other"]


def test_non_finite_numbers_are_rejected() -> None:
    for bad in (float("nan"), float("inf"), -float("inf")):
        with pytest.raises(PluginConfigError, match="finite"):
            Params("p", {"rate": bad}).float("rate", 1.0, min=1.0)
        with pytest.raises(PluginConfigError, match="finite"):
            Params("p", {"d": bad}).duration("d", 1.0)
    with pytest.raises(PluginConfigError, match="out of range"):
        Params("p", {"rate": 10**400}).float("rate", 1.0)


def test_integers_past_64_bits_are_out_of_range() -> None:
    assert Params("p", {"n": (1 << 63) - 1}).int("n", 0) == (1 << 63) - 1
    for bad in (1 << 63, -(1 << 63) - 1, 10**30):
        with pytest.raises(PluginConfigError, match="out of range"):
            Params("p", {"n": bad}).int("n", 0)
