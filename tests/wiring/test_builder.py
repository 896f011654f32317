"""The pipeline builder: required producers are added, producers run in dependency order, a consumer without a
producer is a config error that names it."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import pytest

from epp.config import ConfigError, parse_config
from epp.datalayer.datastore import Datastore
from epp.framework import (
    PREFIX_CACHE_MATCH_INFO,
    TOKENIZED_PROMPT,
    ApiKind,
    DataKey,
    Endpoint,
    InferenceRequest,
    Params,
    Plugin,
    PluginContext,
    PluginRegistry,
)
from epp.plugins.producers.approx_prefix_cache_producer import ApproxPrefixCacheProducer
from epp.plugins.producers.token_producer import TokenProducer
from epp.requestcontrol.pipeline import Pipeline
from epp.tokenization.prompt import HTTPBackend, PromptTokenizer
from epp.tokenization.qwen import QWEN25_MODEL, load_qwen25_tokenizer
from epp.wiring import build_pipeline, plugin_context, register_builtins

SRC = "epp.yaml"


def build(text: str, registry: PluginRegistry | None = None) -> Pipeline:
    return build_pipeline(parse_config(text, SRC), plugin_context(Datastore()), registry)


def test_a_consumer_without_its_producer_is_an_error_naming_it() -> None:
    text = """
plugins:
- type: queue-scorer
- name: pcs
  type: prefix-cache-scorer
  parameters: {prefixMatchInfoProducerName: precise}
"""
    with pytest.raises(ConfigError) as e:
        build(text)
    msg = str(e.value)
    assert msg.startswith(f"{SRC}:4: plugins[1]") and "prefix-cache-match-info/precise" in msg and "'pcs'" in msg


def test_the_default_prefix_producer_is_added_once_with_the_forwarded_parameters() -> None:
    p = build("plugins: [{type: prefix-cache-scorer, parameters: {blockSizeTokens: 32}}, {type: no-hit-lru-scorer}]")
    auto = p.plugins["approx-prefix-cache-producer"]
    assert isinstance(auto, ApproxPrefixCacheProducer) and auto.block_size_tokens == 32
    assert [x.name for x in p.producers] == ["approx-prefix-cache-producer"]


def test_a_name_clash_with_a_required_producer_is_an_error() -> None:
    text = "plugins: [{name: approx-prefix-cache-producer, type: queue-scorer}, {type: prefix-cache-scorer}]"
    with pytest.raises(ConfigError, match="needs prefix-cache-match-info/approx-prefix-cache-producer"):
        build(text)


X = DataKey[int]("x")
Y = DataKey[int]("y")


class _Producer(Plugin):
    makes: tuple[DataKey[Any], ...] = ()
    needs: tuple[DataKey[Any], ...] = ()

    def produces(self) -> Collection[DataKey[Any]]:
        return self.makes

    def consumes(self) -> Collection[DataKey[Any]]:
        return self.needs

    async def prepare(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> None:
        for k in self.needs:
            request.data.require(k)
        for k in self.makes:
            request.data.put(k, 1)


class MakesX(_Producer):
    type_name = "makes-x"
    makes = (X,)


class MakesYFromX(_Producer):
    type_name = "makes-y-from-x"
    makes, needs = (Y,), (X,)


class MakesXFromY(_Producer):
    type_name = "makes-x-from-y"
    makes, needs = (X,), (Y,)


def registry() -> PluginRegistry:
    reg = register_builtins(PluginRegistry())
    for cls in (MakesX, MakesYFromX, MakesXFromY):
        reg.register(cls)
    return reg


async def test_producers_run_after_what_they_consume_whatever_the_config_order() -> None:
    p = build("plugins: [{type: makes-y-from-x}, {type: queue-scorer}, {type: makes-x}]", registry())
    assert [x.name for x in p.producers] == ["makes-x", "makes-y-from-x"]
    r = InferenceRequest("r", "/v1/completions", ApiKind.COMPLETIONS, "m", "m", {})
    for producer in p.producers:
        await producer.prepare(r, [])
    assert r.data.get(Y) == 1


def test_a_dependency_cycle_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"cycle.*makes-y-from-x.*makes-x-from-y"):
        build("plugins: [{type: makes-y-from-x}, {type: makes-x-from-y}]", registry())


def test_precise_prefix_plugins_consume_the_token_producer() -> None:
    p = build("plugins: [{type: precise-prefix-cache-producer, parameters: {kvEventsConfig: {enabled: false}}}]")
    tok = p.plugins["token-producer"]  # added, because nothing configured produces the tokens
    assert isinstance(tok, TokenProducer)
    assert [x.name for x in p.producers] == ["token-producer", "precise-prefix-cache-producer"]
    assert TOKENIZED_PROMPT in tok.produces()
    assert (
        PREFIX_CACHE_MATCH_INFO.of("precise-prefix-cache-producer")
        in p.plugins["precise-prefix-cache-producer"].produces()
    )


async def test_a_token_producer_listed_after_the_precise_producer_is_the_one_used(thread_sim: Any) -> None:
    """Its `vllm.url` takes effect: tokens come from that server (and none when it is down), not a local tokenizer."""
    text = f"""
plugins:
- type: precise-prefix-cache-producer
  parameters: {{kvEventsConfig: {{enabled: false}}, tokenProcessorConfig: {{blockSize: 16}}}}
- type: token-producer
  parameters: {{vllm: {{url: "{thread_sim.url}"}}}}
"""
    p = build(text)
    assert [x.name for x in p.producers] == ["token-producer", "precise-prefix-cache-producer"]
    tok = p.plugins["token-producer"]
    assert isinstance(tok, TokenProducer) and isinstance(tok.tokenizer, PromptTokenizer)
    assert isinstance(tok.tokenizer.backend, HTTPBackend)
    prompt = "The quick brown fox jumps over the lazy dog. " * 8
    r = InferenceRequest("r", "/v1/completions", ApiKind.COMPLETIONS, QWEN25_MODEL, QWEN25_MODEL, {}, prompt=prompt)
    for producer in p.producers:
        await producer.prepare(r, [])
    got = r.data.get(TOKENIZED_PROMPT)
    assert got is not None and got.token_ids == load_qwen25_tokenizer()(prompt)["input_ids"]
    match = r.data.get(PREFIX_CACHE_MATCH_INFO.of("precise-prefix-cache-producer"))
    assert match is not None and match.total_blocks == len(got.token_ids) // 16
    thread_sim.stop()
    r2 = InferenceRequest(
        "r2", "/v1/completions", ApiKind.COMPLETIONS, QWEN25_MODEL, QWEN25_MODEL, {}, prompt=prompt + "!"
    )
    for producer in p.producers:
        await producer.prepare(r2, [])
    assert TOKENIZED_PROMPT not in r2.data


@pytest.mark.parametrize(
    ("parameters", "where"),
    [
        # a quoted "false" used to be bool("false") == True
        ('    speculativeIndexing: "false"\n', "4: plugins[0].parameters.speculativeIndexing: "),
        (
            "    kvEventsConfig:\n      topicFilter: kv@\n      concurrency: lots\n",
            "6: plugins[0].parameters.kvEventsConfig.concurrency: ",
        ),
        ("    tokenProcessorConfig: {blockSize: 0}\n", "4: plugins[0].parameters.tokenProcessorConfig.blockSize: "),
        ("    tokenizer: {type: magic}\n", "4: plugins[0].parameters.tokenizer.type: "),
    ],
)
def test_precise_parameters_are_checked_with_key_and_line(parameters: str, where: str) -> None:
    text = "plugins:\n- type: precise-prefix-cache-producer\n  parameters:\n" + parameters
    with pytest.raises(ConfigError) as e:
        build(text)
    assert str(e.value).startswith(f"{SRC}:{where}"), str(e.value)


class Exploding(Plugin):
    type_name = "exploding"

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Exploding:
        raise RuntimeError("cannot reach the license server")


def test_a_factory_crash_is_a_config_error_with_the_line() -> None:
    reg = register_builtins(PluginRegistry())
    reg.register(Exploding)
    with pytest.raises(ConfigError) as e:
        build("plugins:\n- type: queue-scorer\n- type: exploding\n", reg)
    assert str(e.value) == f"{SRC}:3: plugins[1] (exploding): RuntimeError: cannot reach the license server"


def _parser_types(p: Pipeline) -> list[str]:
    reg = p.parser_registry
    return [x.type_name for x in reg.parsers] + (["fallback"] if reg.fallback else [])


def test_parser_registry_as_the_router_resolves_it() -> None:
    base = "plugins:\n- type: queue-scorer\n"
    # none listed: the router's defaults, passthrough last as the fallback
    assert _parser_types(build(base)) == [
        "openai-parser", "anthropic-parser", "vllmhttp-parser", "passthrough-parser", "fallback"
    ]  # fmt: skip
    # a configured parser of a default type is the one used
    assert build(base + "- name: openai-parser\n  type: openai-parser\n").parser_registry.resolve(
        "/v1/chat/completions"
    )
    # an explicit list is used as given: no fallback
    p = build(base + "- name: gen\n  type: sglanghttp-parser\n- type: anthropic-parser\nrequestHandler:\n"
              "  parsers:\n  - pluginRef: gen\n  - pluginRef: anthropic-parser\n")  # fmt: skip
    assert _parser_types(p) == ["sglanghttp-parser", "anthropic-parser"]
    assert p.parser_registry.resolve("/generate").name == "gen"


def test_a_typo_in_a_plugin_type_is_reported_at_the_typo_with_a_suggestion() -> None:
    text = """plugins:
- name: load
  parameters: {}
  type: queue-scorrer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: load
  - pluginRef: max-score-picker
"""
    with pytest.raises(
        ConfigError,
        match=r"^epp.yaml:4: plugins\[0\]\.type: unknown plugin type 'queue-scorrer' "
        r"\(did you mean 'queue-scorer'\?",
    ):
        build(text)


def test_nan_for_a_rate_does_not_reach_routing() -> None:
    text = "plugins:\n- type: prefill-cost-scorer\n  parameters:\n    prefillTokensPerSecond: .nan\n"
    with pytest.raises(ConfigError, match=r"^epp\.yaml:4: "):
        build(text)


class AnyProfiles(Plugin):
    """A profile handler that runs every profile (any number: it declares no `max_profiles`)."""

    type_name = "any-profiles-handler"

    def pick_profiles(self, state: Any, request: Any, profiles: Any, results: Any) -> list[str]:
        return [] if results else list(profiles)

    def process_results(self, state: Any, request: Any, results: Any) -> Any:
        raise NotImplementedError


class TwoProfiles(AnyProfiles):
    type_name = "two-profiles-handler"
    max_profiles = 2


class Feeds(Plugin):
    """A data source that declares ExtractorHost; `Polls` has an `attach` of its own but declares nothing."""

    type_name = "feeds-source"

    def __init__(self, name: str | None = None) -> None:
        super().__init__(name)
        self.fed: list[str] = []

    def attach_extractors(self, extractors: Sequence[Plugin]) -> None:
        if any(e.type_name != "queue-scorer" for e in extractors):
            raise ValueError("only queue scorers")
        self.fed += [e.name for e in extractors]


class Polls(Plugin):
    type_name = "polls-source"

    def attach(self, contributors: Sequence[Plugin], interval: float | None) -> None:
        raise AssertionError("not an extractor host")


def capability_registry() -> PluginRegistry:
    reg = register_builtins(PluginRegistry())
    for cls in (TwoProfiles, AnyProfiles, Feeds, Polls):
        reg.register(cls)
    return reg


def profiles(handler: str, n: int) -> str:
    text = f"plugins:\n- type: {handler}\n- type: queue-scorer\nschedulingProfiles:\n"
    return text + "".join(f"- name: p{i}\n  plugins: [{{pluginRef: queue-scorer}}]\n" for i in range(n))


def test_max_profiles_is_checked_only_for_a_handler_that_declares_it() -> None:
    reg = capability_registry()
    assert len(build(profiles("two-profiles-handler", 2), reg).scheduler.profiles) == 2
    with pytest.raises(ConfigError, match="two-profiles-handler supports 2 profile, got 3"):
        build(profiles("two-profiles-handler", 3), reg)
    assert len(build(profiles("any-profiles-handler", 3), reg).scheduler.profiles) == 3
    with pytest.raises(ConfigError, match="single-profile-handler supports 1 profile, got 2"):
        build(profiles("single-profile-handler", 2), reg)


def sourced(source: str, extractor: str) -> str:
    return (
        f"plugins:\n- type: {source}\n- type: {extractor}\ndataLayer:\n  sources:\n"
        f"  - {{pluginRef: {source}, extractors: [{{pluginRef: {extractor}}}]}}\n"
    )


def test_data_source_extractors_go_to_an_extractor_host_only() -> None:
    reg = capability_registry()
    feeds = build(sourced("feeds-source", "queue-scorer"), reg).plugins["feeds-source"]
    assert isinstance(feeds, Feeds) and feeds.fed == ["queue-scorer"]
    with pytest.raises(ConfigError, match=r"^epp.yaml:6: dataLayer\.sources\[0\]\.extractors: only queue scorers"):
        build(sourced("feeds-source", "kv-cache-utilization-scorer"), reg)
    assert isinstance(build(sourced("polls-source", "queue-scorer"), reg).plugins["polls-source"], Polls)


def test_a_lone_detector_is_the_pools_unless_it_is_an_admitter() -> None:
    """Without a pluginRef, the one configured saturation detector is used; probabilistic-admitter measures saturation
    for itself and leaves the default detector in place."""
    lone = build("plugins: [{type: queue-scorer}, {name: cd, type: concurrency-detector}]")
    assert lone.saturation_detector.name == "cd"
    admitter = build("plugins: [{type: queue-scorer}, {name: pa, type: probabilistic-admitter}]")
    assert isinstance(admitter.saturation_detector, Plugin)
    assert admitter.saturation_detector.type_name == "utilization-detector"
