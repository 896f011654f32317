"""passthrough-parser (GIE/llm-d `parser.pluginRef`): route without reading the body.

Accepted so configs load; requests are still parsed as OpenAI JSON today.
"""

from __future__ import annotations

from epp.framework import Plugin


class PassthroughParser(Plugin):
    type_name = "passthrough-parser"
