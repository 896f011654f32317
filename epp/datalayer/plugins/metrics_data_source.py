"""metrics-data-source (GIE): where the scraper reads each endpoint's metrics (`scheme`, `path`,
`insecureSkipVerify`); the scrape loops themselves are epp.datalayer.scraper."""

from __future__ import annotations

from typing import Self

from epp.framework import Params, Plugin, PluginContext


class MetricsDataSource(Plugin):
    type_name = "metrics-data-source"

    def __init__(
        self, name: str | None = None, scheme: str = "http", path: str = "/metrics", insecure: bool = True
    ) -> None:
        super().__init__(name)
        self.scheme = scheme
        self.path = path
        self.insecure_skip_verify = insecure

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        return cls(
            name,
            scheme=params.str("scheme", "http", choices=("http", "https")),
            path=params.str("path", "/metrics"),
            insecure=params.bool("insecureSkipVerify", True),
        )
