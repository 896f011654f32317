"""single-profile-handler: run the one configured profile once; its result is the primary (GIE)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from epp.framework import (
    CycleState,
    InferenceRequest,
    Params,
    Plugin,
    PluginConfigError,
    ProfileResult,
    SchedulingResult,
    register,
)


@register("single-profile-handler")
class SingleProfileHandler(Plugin):
    # The config builder checks this: GIE requires exactly one profile with this handler.
    max_profiles = 1

    @classmethod
    def from_config(cls, name: str, parameters: dict[str, Any], context: Any) -> SingleProfileHandler:
        Params(name, parameters)
        return cls(name)

    def pick_profiles(
        self,
        state: CycleState,
        request: InferenceRequest,
        profiles: Mapping[str, Any],
        results: Mapping[str, ProfileResult | None],
    ) -> list[str]:
        if results:
            return []
        if len(profiles) != 1:
            raise PluginConfigError(f"{self.name}: single-profile-handler needs exactly 1 profile, got {len(profiles)}")
        return list(profiles)

    def process_results(
        self, state: CycleState, request: InferenceRequest, results: Mapping[str, ProfileResult | None]
    ) -> SchedulingResult:
        name = next(iter(results), "")
        result = results.get(name)
        return SchedulingResult(profile_results={name: result} if result is not None else {}, primary_profile=name)
