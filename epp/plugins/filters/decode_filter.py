"""decode-filter (llm-d): endpoints that decode (role decode, prefill-decode, both, encode-prefill-decode) or have
no role."""

from __future__ import annotations

from epp.plugins.contracts.disagg import DECODE_ROLES
from epp.plugins.filters._role import RoleFilter


class DecodeFilter(RoleFilter):
    type_name = "decode-filter"
    roles = DECODE_ROLES
    keep_unlabeled = True
