"""What decode-filter, prefill-filter and encode-filter share: keep endpoints by their `llm-d.ai/role` label."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from epp.framework import CycleState, Endpoint, InferenceRequest, Plugin
from epp.plugins.contracts.disagg import ROLE_LABEL


class RoleFilter(Plugin):
    roles: ClassVar[frozenset[str]] = frozenset()
    keep_unlabeled: ClassVar[bool] = False

    def filter(self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[Endpoint]:
        roles, unlabeled = self.roles, self.keep_unlabeled
        out = []
        for ep in endpoints:
            role = ep.labels.get(ROLE_LABEL)
            if (role is None and unlabeled) or (role is not None and role in roles):
                out.append(ep)
        return out
