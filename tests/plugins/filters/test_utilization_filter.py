"""utilization-filter: drops an endpoint over any cap, reads the in-flight producer, rejects bad conditions."""

from __future__ import annotations

import pytest

from epp.datalayer.datastore import Datastore
from epp.framework import (
    INFLIGHT_LOAD,
    InFlightLoad,
    PluginConfigError,
)
from epp.plugins.filters.utilization_filter import UtilizationFilter
from epp.wiring import plugin_context
from tests.helpers import build
from tests.plugins.support_catalog import S, ep, req


def test_utilization_filter_drops_an_endpoint_over_any_cap() -> None:
    f = build(
        UtilizationFilter,
        {
            "conditions": [
                {"metric": "running-requests", "maxValue": 40},
                {"metric": "waiting-queue", "maxValue": 0},
                {"metric": "kv-cache-utilization", "maxValue": 0.8},
            ]
        },
    )
    e = [ep(1, running=10), ep(2, running=41), ep(3, waiting=1), ep(4, kv=0.9), ep(5, running=40, kv=0.8)]
    assert [x.name for x in f.filter(S, req(), e)] == ["e1", "e5"]
    assert f.filter(S, req(), [ep(2, running=41)]) == []
    fb = build(UtilizationFilter, {"conditions": [{"metric": "waiting-queue", "maxValue": 0}], "fallbackOnEmpty": True})
    busy = [ep(1, waiting=3), ep(2, waiting=5)]
    assert fb.filter(S, req(), busy) == busy


def test_utilization_filter_active_requests_reads_the_inflight_producer() -> None:
    ctx = plugin_context(Datastore())
    f = build(UtilizationFilter, {"conditions": [{"metric": "active-requests", "maxValue": 2}]}, ctx=ctx)
    assert [r.type for r in ctx.requirements] == ["inflight-load-producer"]  # the builder adds it
    e1, e2 = ep(1), ep(2)
    e1.attributes.put(INFLIGHT_LOAD.of("inflight-load-producer"), InFlightLoad(requests=3))
    e2.attributes.put(INFLIGHT_LOAD.of("inflight-load-producer"), InFlightLoad(requests=1, remote_requests=1))
    assert f.filter(S, req(), [e1, e2]) == [e2]


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ({}, "conditions"),
        ({"conditions": [{"metric": "gpu", "maxValue": 1}]}, "metric"),
        ({"conditions": [{"metric": "kv-cache-utilization", "maxValue": 2}]}, "must be <= 1.0"),
        ({"conditions": [{"metric": "waiting-queue"}]}, "maxValue"),
        ({"conditions": [{"metric": "waiting-queue", "maxValue": 1, "max": 2}]}, "unknown parameter 'conditions"),
    ],
)
def test_utilization_filter_rejects_bad_conditions(params: dict[str, object], match: str) -> None:
    with pytest.raises(PluginConfigError, match=match):
        build(UtilizationFilter, params)
