"""disagg-headers-handler and prefill-header-handler (llm-d, deprecated since v0.9: disagg-profile-handler sets
the headers itself). After the pick, `x-prefiller-host-port` = the `prefillProfile` pick, `x-encoder-hosts-ports`
= the `encodeProfile` picks; a stage that did not run sends no header."""

from __future__ import annotations

import logging
from typing import Self

from epp.framework import InferenceRequest, Params, Plugin, PluginContext, SchedulingResult
from epp.plugins.contracts.disagg import set_stage_headers

log = logging.getLogger(__name__)


class DisaggHeadersHandler(Plugin):
    type_name = "disagg-headers-handler"
    aliases = ("prefill-header-handler",)

    def __init__(
        self, name: str | None = None, prefill_profile: str = "prefill", encode_profile: str = "encode"
    ) -> None:
        super().__init__(name)
        self.prefill_profile = prefill_profile
        self.encode_profile = encode_profile

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        log.warning("%s: disagg-headers-handler/prefill-header-handler are deprecated: disagg-profile-handler "
                    "sets the headers", name)  # fmt: skip
        return cls(
            name,
            prefill_profile=params.str("prefillProfile", "prefill") or "prefill",
            encode_profile=params.str("encodeProfile", "encode") or "encode",
        )

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        set_stage_headers(request, result, self.prefill_profile, self.encode_profile)
