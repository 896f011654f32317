"""concurrency-detector: saturation and filtering in requests, tokens and hybrid modes."""

from __future__ import annotations

import pytest

from epp.config.loader import parse_config
from epp.datalayer.datastore import Datastore
from epp.framework import (
    INFLIGHT_LOAD,
    ApiKind,
    CycleState,
    Endpoint,
    InferenceRequest,
    InFlightLoad,
    PluginConfigError,
)
from epp.plugins.saturation.concurrency_detector import ConcurrencyDetector
from epp.wiring import build_pipeline, plugin_context
from tests.helpers import build

S = CycleState()
R = InferenceRequest("r", "/", ApiKind.OTHER, "m", "m", {})
LOAD = INFLIGHT_LOAD.of("inflight-load-producer")


def eps(*loads: tuple[int, int]) -> list[Endpoint]:
    out = []
    for i, (requests, tokens) in enumerate(loads):
        e = Endpoint("abcdef"[i], f"10.0.0.{i + 1}", 8000)
        e.attributes.put(LOAD, InFlightLoad(requests=requests, tokens=tokens))
        out.append(e)
    return out


def test_saturation_per_mode() -> None:
    pool = eps((10, 100), (0, 900))
    params = {"maxConcurrency": 10, "maxTokenConcurrency": 1000}
    assert build(ConcurrencyDetector, params).saturation(pool) == pytest.approx(10 / 20)
    assert build(ConcurrencyDetector, {**params, "concurrencyMode": "tokens"}).saturation(pool) == pytest.approx(0.5)
    # hybrid: mean of per-endpoint max(1.0, 0.1) and max(0, 0.9)
    assert build(ConcurrencyDetector, {**params, "concurrencyMode": "hybrid"}).saturation(pool) == pytest.approx(0.95)
    assert build(ConcurrencyDetector).saturation([]) == 1.0
    pool[1].attributes.get(LOAD).remote_requests = 10  # type: ignore[union-attr]
    assert build(ConcurrencyDetector, params).saturation(pool) == pytest.approx(1.0)


def test_filter_drops_endpoints_at_the_limit_with_headroom_and_does_not_fail_open() -> None:
    pool = eps((10, 0), (11, 0), (12, 2000))
    names = lambda kept: [e.name for e in kept]  # noqa: E731
    assert names(build(ConcurrencyDetector, {"maxConcurrency": 10}).filter(S, R, pool)) == []
    assert names(build(ConcurrencyDetector, {"maxConcurrency": 10, "headroom": 0.2}).filter(S, R, pool)) == ["a", "b"]
    hybrid = build(
        ConcurrencyDetector,
        {"concurrencyMode": "hybrid", "maxConcurrency": 20, "maxTokenConcurrency": 1000},
    )
    assert names(hybrid.filter(S, R, pool)) == ["a", "b"]
    tokens = build(ConcurrencyDetector, {"concurrencyMode": "tokens", "maxTokenConcurrency": 1000})
    assert names(tokens.filter(S, R, pool)) == ["a", "b"]


def test_parameters_and_wiring() -> None:
    with pytest.raises(PluginConfigError, match="concurrencyMode"):
        build(ConcurrencyDetector, {"concurrencyMode": "bytes"})
    with pytest.raises(PluginConfigError, match="maxConcurrency"):
        build(ConcurrencyDetector, {"maxConcurrency": 0})
    with pytest.raises(PluginConfigError, match="headroom"):
        build(ConcurrencyDetector, {"headroom": -0.1})
    pipeline = build_pipeline(parse_config("plugins: [{type: concurrency-detector}]"), plugin_context(Datastore()))
    assert isinstance(pipeline.saturation_detector, ConcurrencyDetector)
    assert "inflight-load-producer" in pipeline.plugins
