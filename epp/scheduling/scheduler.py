"""The Scheduler: asks the ProfileHandler which profiles to run, runs them, and lets it pick the primary."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence

from epp.framework import (
    CycleState,
    Endpoint,
    Filter,
    InferenceRequest,
    Picker,
    Plugin,
    ProfileHandler,
    ProfileResult,
    SchedulingResult,
    Scorer,
)
from epp.scheduling import metrics
from epp.scheduling.profile import SchedulerProfile

log = logging.getLogger(__name__)

# Guard against a ProfileHandler that never returns an empty set.
_MAX_ROUNDS = 16


class SchedulingFailed(Exception):
    """No profile produced a target (e.g. every endpoint was filtered out)."""


class Scheduler:
    def __init__(
        self,
        profiles: Mapping[str, SchedulerProfile],
        handler: ProfileHandler,
        *,
        plugin_timing_every: int = 16,
    ) -> None:
        self.profiles = dict(profiles)
        self.handler = handler
        # Per-plugin latency is sampled on one cycle in N: timing every plugin of every cycle costs more than the
        # plugins themselves (prometheus_client observe() takes a lock); 0 disables it.
        self.plugin_timing_every = plugin_timing_every
        self._cycles = 0

    def schedule(self, request: InferenceRequest, candidates: Sequence[Endpoint]) -> SchedulingResult:
        t0 = time.perf_counter()
        self._cycles += 1
        timer = _observe if self.plugin_timing_every and self._cycles % self.plugin_timing_every == 0 else None
        state = CycleState()
        results: dict[str, ProfileResult | None] = {}
        for _ in range(_MAX_ROUNDS):
            if timer is None:
                names = self.handler.pick_profiles(state, request, self.profiles, results)
            else:
                t1 = time.perf_counter()
                names = self.handler.pick_profiles(state, request, self.profiles, results)
                _observe("ProfilePick", self.handler, time.perf_counter() - t1)
            if not names:
                break
            for name in names:
                profile = self.profiles.get(name)
                if profile is None:
                    raise SchedulingFailed(f"profile handler chose unknown profile {name!r}")
                results[name] = profile.run(state, request, candidates, timer)
        result = self.handler.process_results(state, request, results)
        metrics.SCHEDULER_E2E_DURATION.observe(time.perf_counter() - t0)
        if not result.targets:
            raise SchedulingFailed("no endpoints available after running the scheduling profiles")
        return result


def _observe(extension_point: str, plugin: Filter | Scorer | Picker | ProfileHandler, seconds: float) -> None:
    # The builder configures only Plugins; an object that only implements the protocol is labelled by its class.
    type_name = plugin.type_name if isinstance(plugin, Plugin) else type(plugin).__name__
    metrics.PLUGIN_DURATION.labels(extension_point, type_name, plugin.name).observe(seconds)
