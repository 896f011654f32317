"""vllmgrpc-parser (GIE/llm-d `parser.pluginRef`): vLLM's gRPC API through Envoy.

Accepted so configs load; requests are still parsed as OpenAI JSON today.
"""

from __future__ import annotations

from epp.framework import Plugin


class VLLMGRPCParser(Plugin):
    type_name = "vllmgrpc-parser"
