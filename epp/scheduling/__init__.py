"""The scheduling cycle: profiles of filters → weighted scorers → picker, driven by a ProfileHandler."""

from epp.scheduling.profile import SchedulerProfile, WeightedScorer
from epp.scheduling.scheduler import Scheduler, SchedulingFailed

__all__ = ["Scheduler", "SchedulerProfile", "SchedulingFailed", "WeightedScorer"]
