"""The scheduling cycle: filters narrow, scores are clamped, times the weight, and summed, the picker chooses."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from epp.framework import (
    ApiKind,
    CycleState,
    Endpoint,
    InferenceRequest,
    Plugin,
    ProfileResult,
    SchedulingResult,
)
from epp.plugins.pickers.max_score_picker import MaxScorePicker
from epp.plugins.pickers.weighted_random_picker import WeightedRandomPicker
from epp.plugins.profiles.single_profile_handler import SingleProfileHandler
from epp.scheduling import Scheduler, SchedulerProfile, SchedulingFailed, WeightedScorer

R = InferenceRequest("r", "/v1/completions", ApiKind.COMPLETIONS, "m", "m", {})


def eps(n: int) -> list[Endpoint]:
    return [Endpoint(f"e{i}", f"10.0.0.{i + 1}", 8000) for i in range(n)]


class Fixed(Plugin):
    """A scorer returning fixed scores by endpoint name."""

    def __init__(self, name: str, scores: dict[str, float]) -> None:
        super().__init__(name)
        self.scores = scores

    def score(self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[float]:
        return [self.scores.get(e.name, 0.0) for e in endpoints]


class Keep(Plugin):
    def __init__(self, name: str, keep: set[str]) -> None:
        super().__init__(name)
        self.keep = keep

    def filter(self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[Endpoint]:
        return [e for e in endpoints if e.name in self.keep]


class Recorder(Plugin):
    """A picker that records the totals it was given."""

    def __init__(self) -> None:
        super().__init__("rec")
        self.seen: dict[str, float] = {}

    def pick(self, state: CycleState, request: InferenceRequest, scored: Sequence[tuple[Endpoint, float]]) -> Any:
        self.seen = {e.name: s for e, s in scored}
        return MaxScorePicker("m").pick(state, request, scored)


def single(profile: SchedulerProfile) -> Scheduler:
    return Scheduler({profile.name: profile}, SingleProfileHandler("h"))


def test_weighted_sum_is_clamped_and_not_normalized() -> None:
    e = eps(3)
    rec = Recorder()
    prof = SchedulerProfile(
        "default",
        [],
        [
            WeightedScorer(Fixed("a", {"e0": 1.0, "e1": 0.5, "e2": 2.0}), 2.0),  # e2 clamped to 1
            WeightedScorer(Fixed("b", {"e0": 0.0, "e1": 1.0, "e2": -3.0}), 3.0),  # e2 clamped to 0
        ],
        rec,
    )
    res = single(prof).schedule(R, e)
    assert rec.seen == {"e0": 2.0, "e1": 4.0, "e2": 2.0}
    assert res.targets == [e[1]] and res.primary_profile == "default"


def test_weights_change_the_winner() -> None:
    e = eps(2)
    queue_like = Fixed("q", {"e0": 1.0, "e1": 0.0})
    prefix_like = Fixed("p", {"e0": 0.0, "e1": 0.6})
    prof = SchedulerProfile("d", [], [WeightedScorer(queue_like, 1), WeightedScorer(prefix_like, 3)], MaxScorePicker())
    assert single(prof).schedule(R, e).targets == [e[1]]
    prof = SchedulerProfile("d", [], [WeightedScorer(queue_like, 2), WeightedScorer(prefix_like, 3)], MaxScorePicker())
    assert single(prof).schedule(R, e).targets == [e[0]]


def test_filters_narrow_and_empty_filter_fails() -> None:
    e = eps(4)
    prof = SchedulerProfile(
        "d",
        [Keep("k1", {"e1", "e2", "e3"}), Keep("k2", {"e2", "e3"})],
        [WeightedScorer(Fixed("s", {"e3": 1}), 1)],
        MaxScorePicker(),
    )
    assert single(prof).schedule(R, e).targets == [e[3]]
    with pytest.raises(SchedulingFailed):
        single(prof).schedule(R, e[:2])


def test_fallbacks_via_max_num_of_endpoints() -> None:
    e = eps(4)
    s = Fixed("s", {"e0": 0.1, "e1": 0.9, "e2": 0.5, "e3": 0.7})
    prof = SchedulerProfile("d", [], [WeightedScorer(s, 1)], MaxScorePicker("p", max_num=3))
    res = single(prof).schedule(R, e)
    assert [t.name for t in res.targets] == ["e1", "e3", "e2"]
    assert res.profile_results["d"].scores == {"e1": 0.9, "e3": 0.7, "e2": 0.5}


def test_weighted_random_picker_gets_absolute_totals() -> None:
    e = eps(2)
    s = Fixed("s", {"e0": 1.0})
    prof = SchedulerProfile("d", [], [WeightedScorer(s, 5)], WeightedRandomPicker("w"))
    for _ in range(20):
        assert single(prof).schedule(R, e).targets == [e[0]]  # e1 total 0 → never picked


class TwoStage(Plugin):
    """A profile handler running 'decode' then 'prefill' (like llm-d's disaggregation handler)."""

    def pick_profiles(
        self,
        state: CycleState,
        request: InferenceRequest,
        profiles: Mapping[str, Any],
        results: Mapping[str, ProfileResult | None],
    ) -> list[str]:
        if not results:
            return ["decode"]
        if "prefill" not in results:
            return ["prefill"]
        return []

    def process_results(
        self, state: CycleState, request: InferenceRequest, results: Mapping[str, ProfileResult | None]
    ) -> SchedulingResult:
        return SchedulingResult({k: v for k, v in results.items() if v is not None}, "decode")


def test_multi_profile_rounds() -> None:
    e = eps(4)
    decode = SchedulerProfile(
        "decode", [Keep("d", {"e0", "e1"})], [WeightedScorer(Fixed("s", {"e1": 1}), 1)], MaxScorePicker()
    )
    prefill = SchedulerProfile(
        "prefill", [Keep("p", {"e2", "e3"})], [WeightedScorer(Fixed("s", {"e2": 1}), 1)], MaxScorePicker()
    )
    res = Scheduler({"decode": decode, "prefill": prefill}, TwoStage("h")).schedule(R, e)
    assert res.targets == [e[1]]
    assert res.profile_results["prefill"].targets == [e[2]]


def test_scorer_returning_wrong_length_is_an_error() -> None:
    class Bad(Plugin):
        def score(self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[float]:
            return [1.0]

    prof = SchedulerProfile("d", [], [WeightedScorer(Bad("bad"), 1)], MaxScorePicker())
    with pytest.raises(ValueError, match="bad"):
        single(prof).schedule(R, eps(3))


def test_plugin_timing_is_sampled() -> None:
    from epp.scheduling import metrics

    prof = SchedulerProfile("d", [Keep("k", {"e0"})], [WeightedScorer(Fixed("timed", {}), 1)], MaxScorePicker())
    sched = Scheduler({"d": prof}, SingleProfileHandler("h"), plugin_timing_every=4)
    before = metrics.PLUGIN_DURATION.labels("Scorer", "", "timed")._sum.get()
    count = lambda: sum(  # noqa: E731
        s.value
        for m in metrics.PLUGIN_DURATION.collect()
        for s in m.samples
        if s.name.endswith("_count") and s.labels.get("plugin_name") == "timed"
    )
    for _ in range(8):
        sched.schedule(R, eps(2))
    assert count() == 2
    assert metrics.PLUGIN_DURATION.labels("Scorer", "", "timed")._sum.get() >= before


def test_every_pick_is_explained_at_trace_and_a_sample_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    """The explain line (each scorer's score per endpoint) for every pick at V(5), which pick-parity replays read
    (e2e.harness.picklog), and only a sample at V(4)."""
    import logging

    from epp.framework.verbosity import V
    from epp.scheduling import profile

    e = eps(2)
    prof = SchedulerProfile("default", [], [WeightedScorer(Fixed("a", {"e0": 0.25, "e1": 1.0}), 2.0)], Recorder())
    old, profile.PICK_LOG_SAMPLE = profile.PICK_LOG_SAMPLE, 0.0
    try:
        caplog.set_level(logging.DEBUG, logger="epp.scheduling.profile")
        for _ in range(5):
            single(prof).schedule(R, e)
        assert not [r for r in caplog.records if r.getMessage().startswith("pick request=")]
        caplog.set_level(V(5), logger="epp.scheduling.profile")
        for _ in range(5):
            single(prof).schedule(R, e)
    finally:
        profile.PICK_LOG_SAMPLE = old
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("pick request=")]
    assert len(lines) == 5
    assert lines[0] == (
        "pick request=r profile=default picked=10.0.0.2:8000 scores={'10.0.0.1:8000': {'a*2': 0.25, 'total': 0.5}, "
        "'10.0.0.2:8000': {'a*2': 1.0, 'total': 2.0}}"
    )
