"""header-profile-handler (llm-d-router): runs exactly one profile per request, the one a request header names
(`headerName`, default `EPP-Profile`) — for a coordinator that drives encode/prefill/decode itself, one call each.

One profile configured: it always runs. Several: the named one; header missing or blank: `defaultProfile`
(default `decode`); a name that is not configured: nothing runs (the request fails with 429, the reason logged).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Self

from epp.framework import (
    CycleState,
    InferenceRequest,
    Params,
    Plugin,
    PluginContext,
    ProfileResult,
    SchedulingResult,
    Stability,
)
from epp.framework.verbosity import VERBOSE, V
from epp.plugins.profiles.single_profile_handler import one_profile_result

log = logging.getLogger(__name__)


class HeaderProfileHandler(Plugin):
    type_name = "header-profile-handler"
    stability = Stability.ALPHA

    def __init__(self, name: str | None = None, header: str = "epp-profile", default: str = "decode") -> None:
        super().__init__(name)
        self.header, self.default = header.lower(), default

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        header = params.str("headerName", "EPP-Profile").strip() or "EPP-Profile"
        return cls(name, header, params.str("defaultProfile", "decode").strip() or "decode")

    def pick_profiles(
        self,
        state: CycleState,
        request: InferenceRequest,
        profiles: Mapping[str, Any],
        results: Mapping[str, ProfileResult | None],
    ) -> list[str]:
        if results:
            return []
        if len(profiles) == 1:
            return list(profiles)
        value = request.headers.get(self.header, "").strip()
        chosen = value or self.default
        if chosen not in profiles:
            why = f"header {self.header} names {value!r}" if value else f"defaultProfile {chosen!r}"
            log.log(V(VERBOSE), "request %s: %s, which is not a configured profile", request.request_id, why)
            return []
        return [chosen]

    def process_results(
        self, state: CycleState, request: InferenceRequest, results: Mapping[str, ProfileResult | None]
    ) -> SchedulingResult:
        return one_profile_result(results)
