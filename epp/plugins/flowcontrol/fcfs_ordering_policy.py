"""fcfs-ordering-policy (flow control): requests of one flow leave in arrival order.

`edf-ordering-policy` and `slo-deadline-ordering-policy` are accepted as aliases and order the same way here:
every queued request has the same TTL, so the earliest deadline is the earliest arrival.
"""

from __future__ import annotations

from epp.framework import Plugin


class FCFSOrderingPolicy(Plugin):
    type_name = "fcfs-ordering-policy"
    aliases = ("edf-ordering-policy", "slo-deadline-ordering-policy")
    ordering = "fcfs"
