"""vLLM's own request conversion and chat-message parsing, run without importing vllm (its packages pull in torch,
fastapi and the openai SDK, none installed here: vllm is installed --no-deps).

The named top-level functions, classes and constants are taken from vLLM's source files (`ast`) and executed with
stand-ins only for what they import: logging, pydantic base types and the openai SDK's typed response items (given
as attribute objects, which is what pydantic would have built from the request JSON). The code that decides the
conversation and the tools the chat template sees is vLLM's.
"""

from __future__ import annotations
import __future__

import ast
import importlib.util
import json
import logging
import sys
import time
import types
from functools import partial
from pathlib import Path
from typing import Any, ClassVar, Final, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_serializer, model_validator


def vllm_dir() -> Path:
    spec = importlib.util.find_spec("vllm")  # may be the bare package e2e.vllm_interop sets up (no origin)
    assert spec is not None and spec.submodule_search_locations, "vllm is not installed"
    return Path(next(iter(spec.submodule_search_locations)))


def load(relpath: str, names: set[str], ns: dict[str, Any], methods_of: tuple[str, set[str]] | None = None) -> None:
    """Execute the named top-level definitions of vllm/<relpath> into `ns` (annotations left unevaluated)."""
    path = vllm_dir() / relpath
    tree = ast.parse(path.read_text(), str(path))
    body: list[ast.stmt] = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef) and node.name in names:
            body.append(node)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id in names for t in targets):
                body.append(node)
        elif methods_of and isinstance(node, ast.ClassDef) and node.name == methods_of[0]:
            methods: list[ast.stmt] = [
                n for n in node.body if isinstance(n, ast.FunctionDef) and n.name in methods_of[1]
            ]
            assert {getattr(m, "name", "") for m in methods} == methods_of[1], f"{relpath}: methods missing"
            body.append(ast.ClassDef(name=node.name, bases=[], keywords=[], body=methods, decorator_list=[]))
    found = (
        {getattr(n, "name", None) for n in body}
        | {t.id for n in body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
        | {n.target.id for n in body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    )
    assert names <= found, f"{relpath}: not found: {names - found}"
    module = ast.Module(body=body, type_ignores=[])
    ast.fix_missing_locations(module)
    flags = __future__.annotations.compiler_flag
    exec(compile(module, str(path), "exec", flags=flags, dont_inherit=True), ns)


class Obj:
    """A request object as pydantic would give it: attributes from a dict, None when absent."""

    def __init__(self, data: dict[str, Any], **override: Any) -> None:
        self.__dict__.update(data)
        self.__dict__.update(override)

    def __getattr__(self, name: str) -> Any:
        return None

    def model_copy(self, update: dict[str, Any]) -> Obj:
        return Obj({**self.__dict__, **update})


def _base_namespace() -> dict[str, Any]:
    """A fresh module's namespace (registered, so pydantic resolves the classes' postponed annotations in it)."""
    _base_namespace.count = getattr(_base_namespace, "count", 0) + 1  # type: ignore[attr-defined]
    module = types.ModuleType(f"_vllm_source_{_base_namespace.count}")  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    ns = module.__dict__
    ns.update(_stand_ins())
    return ns


def _stand_ins() -> dict[str, Any]:
    return {
        "json": json,
        "time": time,
        "Any": Any,
        "ClassVar": ClassVar,
        "Final": Final,
        "Literal": Literal,
        "cast": cast,
        "partial": partial,
        "BaseModel": BaseModel,
        "ConfigDict": ConfigDict,
        "Field": Field,
        "TypeAdapter": TypeAdapter,
        "model_serializer": model_serializer,
        "model_validator": model_validator,
        "logger": logging.getLogger("vllm-source"),
        "_REMOVED_GUIDED_FIELDS": frozenset(),
    }


def _tool_models(ns: dict[str, Any]) -> None:
    load("entrypoints/serve/engine/protocol.py", {"OpenAIBaseModel"}, ns)
    load("entrypoints/generate/base/protocol.py", {"FunctionDefinition"}, ns)
    load("entrypoints/openai/chat_completion/protocol.py", {"ChatCompletionToolsParam"}, ns)


# -- Anthropic Messages → chat (AnthropicServingMessages.to_chat_completion_request) ------------------------------

_ANTHROPIC_METHODS = {
    "_convert_image_source_to_url",
    "_convert_system_message",
    "_extract_system_text",
    "_convert_messages",
    "_convert_message_content",
    "_convert_block",
    "_convert_tool_use_block",
    "_convert_tool_result_block",
    "_convert_user_tool_result",
    "_resolve_tools",
    "_convert_tools",
}


class _ToolChange:  # AnthropicToolChangeDefinition: no request in these tests changes tools mid-conversation
    pass


def anthropic_to_chat(body: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """vLLM's (messages, tool dicts) for a /v1/messages body (merge_inline_system=False)."""
    ns = _base_namespace()
    ns["AnthropicToolChangeDefinition"] = _ToolChange
    _tool_models(ns)
    load("entrypoints/anthropic/serving.py", set(), ns, ("AnthropicServingMessages", _ANTHROPIC_METHODS))
    conv = ns["AnthropicServingMessages"]

    def block(b: dict[str, Any]) -> Obj:
        return Obj(b)

    system = body.get("system")
    messages = [
        Obj(m, content=m["content"] if isinstance(m["content"], str) else [block(b) for b in m["content"]])
        for m in body["messages"]
    ]
    tools = [Obj(t) for t in body["tools"]] if body.get("tools") is not None else None
    req = Obj(
        body,
        system=system if isinstance(system, str) or system is None else [block(b) for b in system],
        messages=messages,
        tools=tools,
    )
    out: list[dict[str, Any]] = []
    conv._convert_system_message(req, out)
    conv._convert_messages(req.messages, out)
    chat = Obj({"tool_choice": None, "tools": None})
    conv._convert_tools(req, chat)
    return out, [t.model_dump() for t in chat.tools] if chat.tools is not None else None


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """A chat request's tools as vLLM passes them to the template (`[tool.model_dump() for tool in request.tools]`)."""
    if tools is None:
        return None
    ns = _base_namespace()
    _tool_models(ns)
    return [ns["ChatCompletionToolsParam"].model_validate(t).model_dump() for t in tools]


# -- Responses → chat (responses/utils.py construct_input_messages, construct_tool_dicts) ------------------------


class ResponseFunctionToolCall(Obj):
    pass


class FunctionTool(Obj):
    """openai.types.responses.FunctionTool: its model_dump() is the tool's fields."""

    def model_dump(self, **_: Any) -> dict[str, Any]:
        return {"description": None, "strict": None, **self.__dict__}


class _Never:  # NamespaceTool, CustomTool: not used by these requests
    pass


class ResponseReasoningItem(Obj):
    pass


class ResponseOutputMessage(Obj):
    pass


class ResponseFunctionToolCallOutputItem(Obj):
    pass


def _typed(item: dict[str, Any]) -> Any:
    """The typed item pydantic parses from the request's `input` union (dict-form items stay dicts)."""
    kind = item.get("type")
    if kind == "function_call":
        return ResponseFunctionToolCall(item)
    if kind == "reasoning":
        return ResponseReasoningItem(
            item,
            content=[Obj(c) for c in item.get("content") or []],
            summary=[Obj(s) for s in item.get("summary") or []],
        )
    if kind == "message" and item.get("role") == "assistant":
        return ResponseOutputMessage(item, content=[Obj(c) for c in item.get("content") or []])
    if kind == "function_call_output":
        return ResponseFunctionToolCallOutputItem(item)
    return item


def responses_to_chat(body: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    ns = _base_namespace()
    ns.update(
        {
            "ResponseFunctionToolCall": ResponseFunctionToolCall,
            "ResponseReasoningItem": ResponseReasoningItem,
            "ResponseOutputMessage": ResponseOutputMessage,
            "ResponseFunctionToolCallOutputItem": ResponseFunctionToolCallOutputItem,
            "ChatCompletionMessageToolCallParam": dict,
            "FunctionCallTool": dict,
            "ChatCompletionAssistantMessageParam": dict,
            "ChatCompletionToolMessageParam": dict,
            "Iterable": __import__("collections.abc").abc.Iterable,
            "VLLMValidationError": ValueError,
            "FunctionTool": FunctionTool,
            "NamespaceTool": _Never,
            "CustomTool": _Never,
        }
    )
    _tool_models(ns)
    load("tool_parsers/utils.py", {"CUSTOM_TOOL_INPUT_KEY", "_NAMESPACE_TOOL_SEPARATOR", "flat_namespace_tool_name",
                                   "get_function_tools", "iter_response_function_tool_dicts"}, ns)  # fmt: skip
    load(
        "entrypoints/openai/responses/utils.py",
        {"encode_custom_tool_input", "_item_type", "_item_dict", "construct_input_messages",
         "construct_chat_messages_with_tool_call", "_construct_message_from_response_item",
         "convert_tool_responses_to_completions_format", "construct_tool_dicts"},
        ns,
    )  # fmt: skip
    inp = body["input"]
    messages = ns["construct_input_messages"](
        request_instructions=body.get("instructions"),
        request_input=inp if isinstance(inp, str) else [_typed(i) for i in inp],
    )
    request_tools = [FunctionTool(t) if t.get("type") == "function" else t for t in body.get("tools") or []]
    tools = ns["construct_tool_dicts"](request_tools, body.get("tool_choice", "auto"))
    return messages, tools


# -- chat messages → the template's conversation (renderers/chat_utils/chat_message.py) ---------------------------


class _TextOnlyParser:
    """The multimodal content parser, for text-only conversations: no placeholders are ever stored."""

    model_config = Obj({"enable_prompt_embeds": False})

    def mm_placeholder_storage(self) -> dict[str, list[Any]]:
        return {}


class _Tracker:
    def create_parser(self, mm_processor_kwargs: Any = None) -> _TextOnlyParser:
        return _TextOnlyParser()


def conversation(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, content_format: str = "string"
) -> list[dict[str, Any]]:
    """vLLM's `parse_chat_messages` for text-only messages, then `_postprocess_messages`."""
    ns = _base_namespace()
    typed = {
        "ChatCompletionContentPartTextParam", "ChatCompletionContentPartImageEmbedsParam",
        "ChatCompletionContentPartAudioEmbedsParam", "ChatCompletionContentPartVideoEmbedsParam",
        "ChatCompletionContentPartPromptEmbedsParam", "ChatCompletionContentPartInputAudioParam",
        "ChatCompletionContentPartRefusalParam", "CustomChatCompletionContentPILImageParam",
        "CustomThinkCompletionContentParam", "ChatCompletionAssistantMessageParam", "ChatCompletionToolMessageParam",
        "ChatCompletionContentPartImageParam", "ChatCompletionContentPartAudioParam",
        "ChatCompletionContentPartVideoParam", "ResponseInputImageParam",
        "CustomChatCompletionContentToolReferenceParam",
        "ChatCompletionContentPartParam", "ConversationMessage", "ChatCompletionMessageParam",
    }  # fmt: skip
    ns.update({name: dict for name in typed})
    ns["TypeAdapter"] = lambda _t: Obj({"validate_python": lambda part: part})
    ns["VLLMValidationError"] = ValueError
    ns["ContentPart"] = Any
    ns["PROMPT_EMBEDS_PLACEHOLDER_TOKEN"] = "<|prompt_embeds|>"
    # the fields of OpenAI's content-part TypedDicts (the SDK is not installed); others are copied onto text parts
    ns["_KNOWN_CONTENT_PART_FIELDS"] = frozenset(
        {"type", "text", "image_url", "input_audio", "video_url", "audio_url", "refusal", "thinking", "uuid",
         "file", "image_pil", "image_embeds", "audio_embeds", "video_embeds", "data", "name", "detail"}
    )  # fmt: skip
    load(
        "renderers/chat_utils/chat_message.py",
        {"_TextParser", "_ImageEmbedsParser", "_AudioEmbedsParser", "_VideoEmbedsParser", "_PromptEmbedsParser",
         "_InputAudioParser", "_RefusalParser", "_PILImageParser", "_ThinkParser", "_AssistantParser", "_ToolParser",
         "_ImageParser", "_AudioParser", "_VideoParser", "_ResponsesInputImageParser", "MM_PARSER_MAP",
         "_collect_extra_fields",
         "PART_TYPES_TO_SKIP_NONE_CONTENT", "TEXT_PART_TYPES", "_reject_reserved_placeholder_in_text",
         "_RESERVED_PLACEHOLDER_IN_TEXT_ERROR", "parse_chat_message_content_mm_part",
         "parse_chat_message_content_parts", "parse_chat_message_content_part", "_CLAUDE_CODE_BILLING_HEADER",
         "_strip_claude_code_billing_header", "parse_chat_message_content", "_postprocess_messages"},
        ns,
    )  # fmt: skip
    out: list[dict[str, Any]] = []
    for m in json.loads(json.dumps(messages)):
        out.extend(ns["parse_chat_message_content"](m, _Tracker(), content_format, False))
    ns["_postprocess_messages"](out)
    return out
