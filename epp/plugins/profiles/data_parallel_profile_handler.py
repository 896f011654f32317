"""data-parallel-profile-handler (llm-d-router, deprecated there for single-profile-handler with Istio >= 1.28.1):
runs the one profile, then sends the request to the chosen pod's `primaryPort` (default 8000) with
`x-data-parallel-host-port: <pod ip>:<chosen rank port>` for the pod's data-parallel router to forward it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any, Self

from epp.framework import (
    DATA_PARALLEL_HEADER,
    CycleState,
    Endpoint,
    InferenceRequest,
    Params,
    Plugin,
    PluginContext,
    ProfileResult,
    SchedulingResult,
)
from epp.plugins.contracts.disagg import upstream_headers

log = logging.getLogger(__name__)


class DataParallelProfileHandler(Plugin):
    type_name = "data-parallel-profile-handler"
    max_profiles = 1

    def __init__(self, name: str | None = None, primary_port: int = 8000) -> None:
        super().__init__(name)
        self.primary_port = primary_port

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        log.warning("%s: data-parallel-profile-handler is deprecated in llm-d-router: use single-profile-handler", name)
        port = params.int("primaryPort", 8000, min=0, max=65535)
        return cls(name, port or 8000)

    def pick_profiles(
        self,
        state: CycleState,
        request: InferenceRequest,
        profiles: Mapping[str, Any],
        results: Mapping[str, ProfileResult | None],
    ) -> list[str]:
        return [] if results or len(profiles) != 1 else list(profiles)

    def _primary(self, ep: Endpoint) -> Endpoint:
        # the same pod and its data, addressed at the primary port (attributes and metrics are shared)
        return dataclasses.replace(ep, port=self.primary_port, hostport="")

    def process_results(
        self, state: CycleState, request: InferenceRequest, results: Mapping[str, ProfileResult | None]
    ) -> SchedulingResult:
        name = next(iter(results), "")
        result = results.get(name)
        if result is None or not result.targets:
            return SchedulingResult(profile_results={}, primary_profile=name)
        headers = upstream_headers(request)
        headers[DATA_PARALLEL_HEADER] = result.targets[0].hostport
        moved = ProfileResult([self._primary(ep) for ep in result.targets], dict(result.scores))
        return SchedulingResult(profile_results={name: moved}, primary_profile=name)
