"""passthrough-parser (llm-d `requestHandler.parsers`): any body, forwarded untouched and routed on load only.

It claims no paths, so it is the fallback for paths no other parser claims (and the registry stops at it). The EPP
cannot read the payload: there is no model and no prompt, so payload-based scorers (prefix cache) see nothing.
"""

from __future__ import annotations

from collections.abc import Mapping

from epp.framework import ApiKind
from epp.framework.parsing import ParsedRequest
from epp.plugins.parsers._common import ParserPlugin


class PassthroughParser(ParserPlugin):
    type_name = "passthrough-parser"
    paths = ()

    def parse(self, headers: Mapping[str, str], body: bytes) -> ParsedRequest:
        return ParsedRequest(api=ApiKind.PASSTHROUGH)
