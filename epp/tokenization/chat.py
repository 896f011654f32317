"""Chat messages as vLLM hands them to the chat template (`renderers/chat_utils/chat_message.py`
`parse_chat_messages` and `renderers/hf.py` content-format detection), so the EPP renders the engine's prompt.

- Content: a string becomes one text part; text parts (`text`, `input_text`, `output_text`, `refusal`, `thinking`)
  are joined with newlines for "string"-format templates or kept as `{"type": "text", "text": ...}` parts for
  "openai"-format templates (those that loop over `message.content`). Media parts need the engine's multimodal
  processor (placeholders and item hashes), so they are refused here (`MultimodalContent`): the render backend
  handles them.
- Claude Code's billing header line is dropped from system text; assistant `tool_calls` are copied with their JSON
  `arguments` decoded to objects (malformed or non-object → `{}`, empty lists dropped); `reasoning` is also given as
  `reasoning_content`; a tool message's text parts are joined; `name` and `tool_call_id` are kept; nothing else.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from epp.framework.errors import TokenizationError
from epp.framework.keys import BILLING_HEADER_PREFIX

_TEXT_KEYS = {"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal", "thinking": "thinking"}
_MEDIA = {"image_url", "input_image", "image_pil", "image_embeds", "audio_url", "input_audio", "audio_embeds",
          "video_url", "video_embeds", "prompt_embeds"}  # fmt: skip


class MultimodalContent(TokenizationError):
    """The messages carry media the local renderer cannot expand (the engine's processor inserts them)."""


def has_media(messages: Sequence[Any]) -> bool:
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list) and any(isinstance(p, dict) and p.get("type") in _MEDIA for p in content):
            return True
    return False


def _strip_billing(parts: list[Any]) -> list[Any]:
    out: list[Any] = []
    for part in parts:
        text = part if isinstance(part, str) else part.get("text") if isinstance(part, dict) else None
        if not (isinstance(part, str) or (isinstance(part, dict) and part.get("type") == "text")):
            text = None
        if not (isinstance(text, str) and text.startswith(BILLING_HEADER_PREFIX)):
            out.append(part)
            continue
        rest = text.partition("\n")[2]
        if rest:
            out.append(rest if isinstance(part, str) else {**part, "text": rest})
    return out


class _Media(str):
    """A media part's place among the texts: its modality (`{"type": <modality>}` for the template)."""


_IMAGE = _Media("image")


def _texts(parts: list[Any], where: str, media: bool = False) -> list[str]:
    texts: list[str] = []
    for part in parts:
        if isinstance(part, str):
            texts.append(part)
            continue
        if not isinstance(part, dict):
            raise TokenizationError(f"{where}: a content part must be an object")
        kind = part.get("type")
        if kind in _MEDIA or (kind is None and any(k in part for k in ("image_url", "input_audio", "video_url"))):
            if media and (kind in ("image_url", "input_image") or (kind is None and "image_url" in part)):
                texts.append(_IMAGE)
                continue
            raise MultimodalContent(f"{where}: {kind or 'media'} content needs the model server's renderer")
        key = _TEXT_KEYS.get(kind) if isinstance(kind, str) else None
        if key is None:
            if kind == "tool_reference":
                continue
            raise TokenizationError(f"{where}: unsupported content part type {str(kind)[:40]!r}")
        value = part.get(key)
        if isinstance(value, str):
            texts.append(value)
    return texts


def _arguments(value: Any) -> dict[str, Any]:
    if not value:
        return {}
    if isinstance(value, dict):
        return value
    parsed = value
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            return {}
    return parsed if isinstance(parsed, dict) else {}


def conversation(messages: Sequence[Any], content_format: str = "string", media: bool = False) -> list[dict[str, Any]]:
    """The conversation vLLM passes to `apply_chat_template` for these OpenAI chat messages. With `media`, image
    parts become `{"type": "image"}` parts ("openai"-format templates only; vLLM's string-format placeholders
    are model-specific, so those still need the renderer)."""
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise TokenizationError(f"{where} must be an object with a role")
        role = m["role"]
        content = m.get("content")
        if content is None:
            parts: list[Any] = []
        elif isinstance(content, str):
            parts = [{"type": "text", "text": content}]
        elif isinstance(content, list):
            parts = content
        else:
            raise TokenizationError(f"{where}.content must be a string or an array of parts")
        if role == "system":
            parts = _strip_billing(parts)
        texts = _texts(parts, where, media)
        msg: dict[str, Any] = {"role": role}
        if content_format == "openai":
            msg["content"] = [{"type": t} if isinstance(t, _Media) else {"type": "text", "text": t} for t in texts]
        elif any(isinstance(t, _Media) for t in texts):
            raise MultimodalContent(
                f"{where}: this chat template renders no media parts: use the model server's renderer"
            )
        else:
            msg["content"] = "\n".join(texts)
        if role == "assistant":
            calls = m.get("tool_calls")
            if calls is not None:
                if not isinstance(calls, list):
                    raise TokenizationError(f"{where}.tool_calls must be an array")
                calls = copy.deepcopy(calls)
                for call in calls:
                    fn = call.get("function") if isinstance(call, dict) else None
                    if not isinstance(fn, dict) or call.get("type", "function") != "function":
                        raise TokenizationError(f"{where}.tool_calls: only function tool calls are supported")
                    fn["arguments"] = _arguments(fn.get("arguments"))
                if calls:
                    msg["tool_calls"] = calls
            reasoning = m.get("reasoning")
            if reasoning is not None:
                msg["reasoning"] = reasoning
                msg["reasoning_content"] = reasoning
        elif role == "tool":
            if "tool_call_id" in m:
                msg["tool_call_id"] = m["tool_call_id"]
            if any(isinstance(t, _Media) for t in texts):
                raise MultimodalContent(f"{where}: media in a tool message needs the model server's renderer")
            if isinstance(msg["content"], list):
                msg["content"] = "\n".join(texts)
        if isinstance(m.get("name"), str):
            msg["name"] = m["name"]
        if role == "developer":
            msg["tools"] = m.get("tools")
        out.append(msg)
    return out


def tool_dicts(tools: Any) -> list[dict[str, Any]] | None:
    """Chat tools as vLLM passes them to the template (`ChatCompletionToolsParam.model_dump()`): type and a
    function with name, description and parameters (null when absent), strict/defer_loading only when set."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise TokenizationError("tools must be an array")
    out = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise TokenizationError(f"tools[{i}] must be a function tool with a name")
        function: dict[str, Any] = {
            "name": fn["name"],
            "description": fn.get("description"),
            "parameters": fn.get("parameters"),
        }
        defer = fn.get("defer_loading", tool.get("defer_loading"))
        if fn.get("strict") is not None:
            function["strict"] = fn["strict"]
        if defer is not None:
            function["defer_loading"] = defer
        dumped: dict[str, Any] = {"type": "function", "function": function}
        if tool.get("defer_loading") is not None:
            dumped["defer_loading"] = tool["defer_loading"]
        out.append(dumped)
    return out


@lru_cache(maxsize=64)
def content_format(chat_template: str) -> str:
    """ "openai" when the template loops over a message's content (it renders parts), else "string"."""
    import jinja2
    from jinja2 import nodes

    try:
        ast = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"]).parse(chat_template)
    except jinja2.TemplateError:
        return "string"
    message_lists = {"messages"}
    for assign in ast.find_all(nodes.Assign):
        if isinstance(assign.target, nodes.Name) and _reads(assign.node, message_lists):
            message_lists.add(assign.target.name)
    message_vars = {
        loop.target.name
        for loop in ast.find_all(nodes.For)
        if isinstance(loop.target, nodes.Name) and _reads(loop.iter, message_lists)
    }
    for loop in ast.find_all(nodes.For):
        it = loop.iter
        if isinstance(it, nodes.Getitem | nodes.Getattr) and _is_content_of(it, message_vars):
            return "openai"
        if isinstance(it, nodes.Name) and it.name == "content":
            return "openai"
    return "string"


def _reads(node: Any, names: set[str]) -> bool:
    from jinja2 import nodes

    while isinstance(node, nodes.Getitem | nodes.Getattr | nodes.Filter) and node.node is not None:
        node = node.node
    return isinstance(node, nodes.Name) and node.name in names


def _is_content_of(node: Any, names: set[str]) -> bool:
    from jinja2 import nodes

    key = node.attr if isinstance(node, nodes.Getattr) else getattr(node.arg, "value", None)
    return key == "content" and isinstance(node.node, nodes.Name) and node.node.name in names
