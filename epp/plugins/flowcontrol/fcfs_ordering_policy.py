"""fcfs-ordering-policy (flow control): requests of one flow leave in arrival order."""

from __future__ import annotations

from epp.framework import Plugin


class FCFSOrderingPolicy(Plugin):
    type_name = "fcfs-ordering-policy"
    ordering = "fcfs"
