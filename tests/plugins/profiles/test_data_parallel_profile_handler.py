"""data-parallel-profile-handler through the real builder, scheduler and director: the primary port and the rank
header."""

from __future__ import annotations

import time

import pytest

from epp.config.loader import parse_config
from epp.datalayer.datastore import Datastore
from epp.framework import Endpoint, Metrics, PluginConfigError
from epp.plugins.profiles.data_parallel_profile_handler import DataParallelProfileHandler
from epp.requestcontrol.director import SchedulingDirector
from epp.wiring import build_pipeline, plugin_context
from tests.helpers import build
from tests.plugins.profiles.support_handlers import req


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
