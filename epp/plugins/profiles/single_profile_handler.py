"""single-profile-handler: run the one configured profile once; its result is the primary (GIE)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from epp.framework import CycleState, InferenceRequest, Plugin, PluginConfigError, ProfileResult, SchedulingResult


class SingleProfileHandler(Plugin):
    type_name = "single-profile-handler"
    # The config builder checks this: GIE requires exactly one profile with this handler.
    max_profiles = 1

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
        return one_profile_result(results)


def one_profile_result(results: Mapping[str, ProfileResult | None]) -> SchedulingResult:
    """The result of the one profile that ran (none: an empty result, which fails the request)."""
    name = next(iter(results), "")
    result = results.get(name)
    return SchedulingResult(profile_results={name: result} if result is not None else {}, primary_profile=name)
