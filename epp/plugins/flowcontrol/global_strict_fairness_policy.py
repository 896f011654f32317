"""global-strict-fairness-policy (flow control, GIE's default): one FCFS order across all flows of a band."""

from __future__ import annotations

from epp.framework import Plugin


class GlobalStrictFairnessPolicy(Plugin):
    type_name = "global-strict-fairness-policy"
    strict = True
