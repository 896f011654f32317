"""always-disagg-pd-decider (llm-d): every request is disaggregated into prefill and decode."""

from __future__ import annotations

from epp.framework import CycleState, Endpoint, InferenceRequest, Plugin


class AlwaysDisaggPDDecider(Plugin):
    type_name = "always-disagg-pd-decider"

    def disaggregate(self, state: CycleState, request: InferenceRequest, endpoint: Endpoint | None) -> bool:
        return True
