"""openai-parser (GIE/llm-d `parser.pluginRef`): OpenAI JSON (chat, completions, responses, embeddings).

Every request is parsed this way today (epp.protocol.openai); the type exists so configs that name it load.
"""

from __future__ import annotations

from epp.framework import Plugin


class OpenAIParser(Plugin):
    type_name = "openai-parser"
