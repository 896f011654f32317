"""disaggregatedset-rollout-screener: one revision per request, weighted by Ready pods; strict headers; stamping."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from epp.config.loader import parse_config
from epp.datalayer.datastore import Datastore
from epp.framework import ApiKind, Endpoint, InferenceRequest, PluginConfigError, Response, ServiceUnavailable
from epp.plugins.requestcontrol.disaggregatedset_rollout_screener import (
    DisaggregatedSetRolloutScreener,
    parse_label_selector,
)
from epp.requestcontrol.director import SchedulingDirector
from epp.wiring import build_pipeline, plugin_context
from tests.helpers import build

SET = "disaggregatedset.x-k8s.io/name"
REV = "disaggregatedset.x-k8s.io/revision"
ROLE = "disaggregatedset.x-k8s.io/role"


def pool() -> Datastore:
    """The README's 2P:10D rollout step: A has 2 prefill + 9 decode, B 1 + 1; C has decode only; D is another set."""
    eps = []
    n = 0

    def add(rev: str, role: str, count: int, ranks: int = 1, name: str = "my-set") -> None:
        nonlocal n
        for _ in range(count):
            n += 1
            for r in range(ranks):
                labels = {SET: name, REV: rev, ROLE: role, "llm-d.ai/role": role}
                eps.append(Endpoint(f"pod{n}-rank-{r}", f"10.0.{n}.1", 8000 + r, labels=labels, pod_name=f"pod{n}"))

    add("A", "prefill", 2, ranks=4)  # ranks do not inflate the pod count
    add("A", "decode", 9)
    add("B", "prefill", 1)
    add("B", "decode", 1)
    add("C", "decode", 5)
    add("Z", "prefill", 3, name="other-set")
    add("Z", "decode", 3, name="other-set")
    ds = Datastore()
    ds.replace_all(eps)
    return ds


def screener(ds: Datastore, mode: str, **extra: object) -> DisaggregatedSetRolloutScreener:
    params = {
        "scope": {"labelSelector": f"{SET}=my-set"},
        "revisionGating": {"mode": mode, "requireRoles": {"values": ["prefill", "decode"]}},
        "headerSelectors": [
            {"name": "revision", "headerName": "x-disagg-revision", "labelKey": REV, "mode": "strict"},
            {"name": "slice", "headerName": "x-disagg-slice", "labelKey": "slice", "mode": "prefer"},
        ],
        **extra,
    }
    s = build(DisaggregatedSetRolloutScreener, params, ctx=plugin_context(ds))
    s.rng = random.Random(3)
    return s


def req(headers: dict[str, str] | None = None) -> InferenceRequest:
    return InferenceRequest(
        "r", "/v1/completions", ApiKind.COMPLETIONS, "m", "m", {"prompt": "x"}, headers=headers or {}
    )


def test_weights_by_mode() -> None:
    ds = pool()
    assert screener(ds, "max-role").revision_weights() == {"A": 9.0, "B": 1.0}  # decode dominates; C incomplete
    assert screener(ds, "sum").revision_weights() == {"A": 11.0, "B": 2.0}


def test_each_request_stays_on_one_revision_in_proportion() -> None:
    ds = pool()
    s = screener(ds, "max-role")
    seen: Counter[str] = Counter()
    for _ in range(2000):
        kept = s.screen(req(), list(ds.endpoints()))
        revs = {ep.labels[REV] for ep in kept}
        assert len(revs) == 1 and {ep.labels[ROLE] for ep in kept} == {"prefill", "decode"}
        seen[revs.pop()] += 1
    assert seen["A"] / 2000 == pytest.approx(0.9, abs=0.03) and "C" not in seen and "Z" not in seen


def test_strict_header_and_fail_closed() -> None:
    ds = pool()
    s = screener(ds, "sum")
    kept = s.screen(req({"x-disagg-revision": "B"}), list(ds.endpoints()))
    assert {ep.labels[REV] for ep in kept} == {"B"}
    with pytest.raises(ServiceUnavailable):
        s.screen(req({"x-disagg-revision": "Q"}), list(ds.endpoints()))
    partial = Datastore()
    partial.replace_all([ep for ep in ds.endpoints() if ep.labels[REV] == "C"])
    with pytest.raises(ServiceUnavailable):
        screener(partial, "max-role").screen(req(), list(partial.endpoints()))
    assert len(screener(partial, "disabled").screen(req(), list(partial.endpoints()))) == 5


def test_served_labels_are_stamped() -> None:
    ds = pool()
    s = screener(ds, "disabled")
    ep = next(iter(ds.endpoints()))
    ep.labels["slice"] = "1"
    resp = Response(200)
    s.response_received(req(), resp, ep)
    assert resp.set_headers == {"x-disagg-revision": "A", "x-disagg-slice": "1"}


async def test_director_applies_the_screen_to_every_profile() -> None:
    ds = pool()
    text = f"""
plugins:
- type: disaggregatedset-rollout-screener
  parameters:
    scope: {{labelSelector: "{SET} in (my-set)"}}
    revisionGating: {{mode: max-role, requireRoles: {{values: [prefill, decode]}}}}
- type: decode-filter
- type: random-picker
schedulingProfiles:
- {{name: d, plugins: [{{pluginRef: decode-filter}}, {{pluginRef: random-picker}}]}}
"""
    d = SchedulingDirector(ds, build_pipeline(parse_config(text), plugin_context(ds)))
    revs: Counter[str] = Counter()
    for _ in range(200):
        decision = await d.handle_request(req())
        revs[decision.endpoints[0].labels[REV]] += 1
    assert set(revs) <= {"A", "B"} and revs["A"] > revs["B"]


def test_parameters_and_selector_parsing() -> None:
    assert [(r.key, r.operator, sorted(r.values)) for r in parse_label_selector("a=1, b != 2, c in (x, y), !d, e")] == [
        ("a", "In", ["1"]),
        ("b", "NotIn", ["2"]),
        ("c", "In", ["x", "y"]),
        ("d", "DoesNotExist", []),
        ("e", "Exists", []),
    ]
    ds = Datastore()
    with pytest.raises(PluginConfigError, match="revisionGating"):
        build(DisaggregatedSetRolloutScreener, {"scope": {"labelSelector": "a=b"}}, ctx=plugin_context(ds))
    with pytest.raises(PluginConfigError, match="requiredRoles"):  # llm-d's wide-ep-lws guide spells it so
        build(
            DisaggregatedSetRolloutScreener,
            {"scope": {"labelSelector": "a=b"}, "revisionGating": {"mode": "sum", "requiredRoles": ["p"]}},
            ctx=plugin_context(ds),
        )
