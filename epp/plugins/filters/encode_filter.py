"""encode-filter (llm-d): endpoints whose `llm-d.ai/role` includes encode (unlabeled endpoints are dropped)."""

from __future__ import annotations

from epp.plugins.filters._role import RoleFilter


class EncodeFilter(RoleFilter):
    type_name = "encode-filter"
    roles = frozenset({"encode", "encode-prefill", "encode-prefill-decode"})
