"""multicluster-session-affinity-filter (llm-d-router, Alpha): session-affinity-filter under its multi-cluster name:
a hub keeps a session on the cluster it used before (the same parameters and behaviour)."""

from __future__ import annotations

from epp.framework import Stability
from epp.plugins.filters.session_affinity_filter import SessionAffinityFilter


class MultiClusterSessionAffinityFilter(SessionAffinityFilter):
    type_name = "multicluster-session-affinity-filter"
    stability = Stability.ALPHA
