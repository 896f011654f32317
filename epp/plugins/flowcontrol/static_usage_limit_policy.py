"""static-usage-limit-policy (flow control): dispatch is held while pool saturation ≥ `threshold` (default 1.0)."""

from __future__ import annotations

from typing import Self

from epp.framework import Params, Plugin, PluginContext


class StaticUsageLimitPolicy(Plugin):
    type_name = "static-usage-limit-policy"

    def __init__(self, name: str | None = None, threshold: float = 1.0) -> None:
        super().__init__(name)
        self.threshold = threshold

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        return cls(name, params.float("threshold", 1.0, min=0.0, min_exclusive=True))
