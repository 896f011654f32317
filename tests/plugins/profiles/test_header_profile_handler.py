"""header-profile-handler through the real builder, scheduler and director: runs the named profile only."""

from __future__ import annotations

import time

import pytest

from epp.config.loader import parse_config
from epp.datalayer.datastore import Datastore
from epp.framework import Endpoint, Metrics
from epp.scheduling.scheduler import SchedulingFailed
from epp.wiring import build_pipeline, plugin_context
from tests.plugins.profiles.support_handlers import req

ROLES = {"e": "encode", "p": "prefill", "d": "decode"}


def store() -> Datastore:
    ds = Datastore()
    eps = []
    for i, (n, role) in enumerate(ROLES.items(), 1):
        e = Endpoint(n, f"10.0.0.{i}", 8000, labels={"llm-d.ai/role": role})
        e.metrics = Metrics(update_time=time.monotonic())
        eps.append(e)
    ds.replace_all(eps)
    return ds


COORD = """
plugins:
- type: encode-filter
- type: prefill-filter
- type: decode-filter
- type: header-profile-handler
schedulingProfiles:
- {name: encode, plugins: [{pluginRef: encode-filter}]}
- {name: prefill, plugins: [{pluginRef: prefill-filter}]}
- {name: decode, plugins: [{pluginRef: decode-filter}]}
"""


def test_header_profile_handler_runs_the_named_profile_only() -> None:
    ds = store()
    sched = build_pipeline(parse_config(COORD), plugin_context(ds)).scheduler
    eps = list(ds.endpoints())
    for profile, pod in (("encode", "e"), ("prefill", "p"), ("decode", "d")):
        result = sched.schedule(req({"epp-profile": profile}), eps)
        assert list(result.profile_results) == [profile] and result.primary_profile == profile
        assert [t.name for t in result.targets] == [pod]
    assert [t.name for t in sched.schedule(req(), eps).targets] == ["d"]  # no header: defaultProfile decode
    with pytest.raises(SchedulingFailed):
        sched.schedule(req({"epp-profile": "transcode"}), eps)


def test_header_profile_handler_parameters_and_single_profile() -> None:
    ds = store()
    text = COORD.replace(
        "- type: header-profile-handler",
        "- type: header-profile-handler\n  parameters:\n    headerName: X-Stage\n    defaultProfile: prefill",
    )
    sched = build_pipeline(parse_config(text), plugin_context(ds)).scheduler
    eps = list(ds.endpoints())
    assert [t.name for t in sched.schedule(req(), eps).targets] == ["p"]
    assert [t.name for t in sched.schedule(req({"x-stage": "encode"}), eps).targets] == ["e"]
    one = (
        "plugins:\n- type: decode-filter\n- type: header-profile-handler\n"
        "schedulingProfiles:\n- {name: only, plugins: [{pluginRef: decode-filter}]}\n"
    )
    single = build_pipeline(parse_config(one), plugin_context(ds)).scheduler
    assert [t.name for t in single.schedule(req({"epp-profile": "whatever"}), eps).targets] == ["d"]
