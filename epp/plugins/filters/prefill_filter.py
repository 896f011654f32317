"""prefill-filter (llm-d): endpoints whose `llm-d.ai/role` includes prefill (unlabeled endpoints are dropped)."""

from __future__ import annotations

from epp.plugins.filters._role import RoleFilter


class PrefillFilter(RoleFilter):
    type_name = "prefill-filter"
    roles = frozenset({"prefill", "encode-prefill", "prefill-decode", "both", "encode-prefill-decode"})
