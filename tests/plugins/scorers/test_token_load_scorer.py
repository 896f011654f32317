"""token-load-scorer reads the inflight-load-producer's counters (all replicas'); consumers add the default producer."""

from __future__ import annotations

import pytest

from epp.config.loader import ConfigError, parse_config
from epp.datalayer.datastore import Datastore
from epp.framework import (
    ApiKind,
    InferenceRequest,
)
from epp.plugins.producers.inflight_load_producer import InFlightLoadProducer
from epp.plugins.scorers.token_load_scorer import TokenLoadScorer
from epp.wiring import build_pipeline, plugin_context
from tests.helpers import build
from tests.plugins.scorers.support_load import S, book, req, setup


async def test_token_load_scorer_counts_in_flight_plus_this_requests_uncached_tokens() -> None:
    ds, (a, b, c), p = setup()
    s = build(TokenLoadScorer, {"queueThresholdTokens": 1000}, ctx=plugin_context(ds))
    book(p, a, 500, "1")
    book(p, b, 2000, "2")
    r = req("new", tokens=100)
    await p.prepare(r, [a, b, c])
    # a: 500 + 100 → 0.4; b: over the threshold → 0; c: 100 → 0.9
    assert s.score(S, r, [a, b, c]) == pytest.approx([0.4, 0.0, 0.9])
    p.loads["c"].remote_tokens = 400  # another replica's load counts too
    assert s.score(S, r, [a, b, c])[2] == pytest.approx(0.5)
    assert s.score(S, InferenceRequest("x", "/", ApiKind.OTHER, "m", "m", {}), [a])[0] == pytest.approx(0.5)


def test_token_load_scorer_defaults() -> None:
    assert build(TokenLoadScorer).threshold == 4194304
    assert build(TokenLoadScorer, {"queueThresholdTokens": 0}).threshold == 4194304  # <= 0: the default


def test_consumers_add_the_default_producer_and_a_named_one_must_exist() -> None:
    ds = Datastore()
    pipeline = build_pipeline(parse_config("plugins: [{type: token-load-scorer}]"), plugin_context(ds))
    assert isinstance(pipeline.plugins["inflight-load-producer"], InFlightLoadProducer)
    cfg = parse_config(
        "plugins:\n- {type: active-request-scorer, parameters: {inFlightLoadProducerName: mine}}\n"
        "- {type: inflight-load-producer, name: mine}\n"
    )
    pipeline = build_pipeline(cfg, plugin_context(ds))
    assert sorted(pipeline.plugins) == ["active-request-scorer", "mine"]
    with pytest.raises(ConfigError, match="needs inflight-load/nobody"):
        build_pipeline(
            parse_config("plugins:\n- {type: token-load-scorer, parameters: {inFlightLoadProducerName: nobody}}\n"),
            plugin_context(ds),
        )
