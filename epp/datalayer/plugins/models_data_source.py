"""models-data-source (llm-d-router): polls each endpoint's OpenAI `/v1/models` (`scheme`, `path`,
`insecureSkipVerify`, `interval`) and feeds the answer to its models-data-extractor."""

from __future__ import annotations

from typing import Self

from epp.datalayer.plugins._polling_source import PollingSource
from epp.framework import Params, PluginContext


class ModelsDataSource(PollingSource):
    type_name = "models-data-source"
    extractor_types = ("models-data-extractor",)

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        for key in ("caCertPath", "clientCertPath", "clientKeyPath"):
            if params.has(key):
                raise params.fail(key, "TLS client settings are not supported for models-data-source")
        src = cls(name, context.endpoints, **cls.common(params, "/v1/models"))
        src.start(context)
        return src
