"""header-profile-handler and data-parallel-profile-handler through the real builder, scheduler and director."""

from __future__ import annotations

import time

import pytest

from epp.config.loader import parse_config
from epp.datalayer.datastore import Datastore
from epp.framework import Endpoint, InferenceRequest, Metrics, PluginConfigError
from epp.plugins.profiles.data_parallel_profile_handler import DataParallelProfileHandler
from epp.requestcontrol.director import SchedulingDirector
from epp.scheduling.scheduler import SchedulingFailed
from epp.wiring import build_pipeline, plugin_context
from tests.helpers import build

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


def req(headers: dict[str, str] | None = None) -> InferenceRequest:
    return InferenceRequest("r", "/v1/completions", "completions", "m", "m", {"prompt": "x"}, headers=headers or {})


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


async def test_data_parallel_handler_targets_the_primary_port_with_the_rank_header() -> None:
    ds = Datastore()
    ranks = [Endpoint(f"pod-rank-{i}", "10.0.0.7", 8000 + i) for i in range(4)]
    for r in ranks:
        r.metrics = Metrics(waiting_queue_size=0 if r.port == 8002 else 5, update_time=time.monotonic())
    ds.replace_all(ranks)
    text = (
        "plugins:\n- type: queue-scorer\n- type: data-parallel-profile-handler\n  parameters: {primaryPort: 8000}\n"
        "schedulingProfiles:\n- {name: default, plugins: [{pluginRef: queue-scorer}]}\n"
    )
    d = SchedulingDirector(ds, build_pipeline(parse_config(text), plugin_context(ds)))
    decision = await d.handle_request(req())
    assert [e.hostport for e in decision.endpoints] == ["10.0.0.7:8000"]  # the pod's primary port
    assert decision.headers["x-data-parallel-host-port"] == "10.0.0.7:8002"  # the rank the queue scorer chose
    with pytest.raises(PluginConfigError, match="primaryPort"):
        build(DataParallelProfileHandler, {"primaryPort": 70000})
