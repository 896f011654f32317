"""decode-filter / prefill-filter / encode-filter (llm-d): keep endpoints by their `llm-d.ai/role` label."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from epp.framework import CycleState, Endpoint, InferenceRequest, Params, Plugin, register

ROLE_LABEL = "llm-d.ai/role"


class _RoleFilter(Plugin):
    roles: ClassVar[frozenset[str]] = frozenset()
    keep_unlabeled: ClassVar[bool] = False

    @classmethod
    def from_config(cls, name: str, parameters: dict[str, Any], context: Any) -> _RoleFilter:
        Params(name, parameters)
        return cls(name)

    def filter(self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[Endpoint]:
        roles, unlabeled = self.roles, self.keep_unlabeled
        out = []
        for ep in endpoints:
            role = ep.labels.get(ROLE_LABEL)
            if (role is None and unlabeled) or (role is not None and role in roles):
                out.append(ep)
        return out


@register("decode-filter")
class DecodeFilter(_RoleFilter):
    roles = frozenset({"decode", "prefill-decode", "both", "encode-prefill-decode"})
    keep_unlabeled = True


@register("prefill-filter")
class PrefillFilter(_RoleFilter):
    roles = frozenset({"prefill", "encode-prefill", "prefill-decode", "both", "encode-prefill-decode"})


@register("encode-filter")
class EncodeFilter(_RoleFilter):
    roles = frozenset({"encode", "encode-prefill", "encode-prefill-decode"})
