"""round-robin-fairness-policy (flow control): a priority band dispatches its flows in turn (our default)."""

from __future__ import annotations

from epp.framework import Plugin


class RoundRobinFairnessPolicy(Plugin):
    type_name = "round-robin-fairness-policy"
    strict = False
