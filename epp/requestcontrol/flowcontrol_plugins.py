"""Flow-control policy plugin types of EndpointPickerConfig (referenced from flowControl.priorityBands[] and
flowControl.usageLimitPolicyPluginRef), so GIE flow-control configs load and their choices take effect.

- fairness across flows in a band: `round-robin-fairness-policy` (our default) or `global-strict-fairness-policy`
  (GIE's default: one FCFS order across all flows of the band);
- ordering within a flow: `fcfs-ordering-policy`; `edf-ordering-policy` and `slo-deadline-ordering-policy` are
  accepted and order like FCFS here, because every queued request has the same TTL (the earliest deadline is the
  earliest arrival);
- `static-usage-limit-policy` (`threshold`, default 1.0): dispatch is held while saturation ≥ threshold.
"""

from __future__ import annotations

from typing import Any

from epp.framework import Params, Plugin, register

ROUND_ROBIN = "round-robin-fairness-policy"
GLOBAL_STRICT = "global-strict-fairness-policy"


class FairnessPolicy(Plugin):
    strict = False

    @classmethod
    def from_config(cls, name: str, parameters: dict[str, Any], context: Any) -> FairnessPolicy:
        Params(name, parameters)
        return cls(name)


@register(ROUND_ROBIN)
class RoundRobinFairness(FairnessPolicy):
    strict = False


@register(GLOBAL_STRICT)
class GlobalStrictFairness(FairnessPolicy):
    strict = True


@register("fcfs-ordering-policy", "edf-ordering-policy", "slo-deadline-ordering-policy")
class OrderingPolicy(Plugin):
    @classmethod
    def from_config(cls, name: str, parameters: dict[str, Any], context: Any) -> OrderingPolicy:
        Params(name, parameters)
        return cls(name)


@register("static-usage-limit-policy")
class StaticUsageLimitPolicy(Plugin):
    def __init__(self, name: str | None = None, threshold: float = 1.0) -> None:
        super().__init__(name)
        self.threshold = threshold

    @classmethod
    def from_config(cls, name: str, parameters: dict[str, Any], context: Any) -> StaticUsageLimitPolicy:
        p = Params(name, parameters)
        return cls(name, p.float("threshold", 1.0, min=0.0, min_exclusive=True))
