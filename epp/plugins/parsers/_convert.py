"""Anthropic Messages and OpenAI Responses requests as the OpenAI chat messages and tools vLLM renders for them.

vLLM serves both APIs by converting them to a chat request (`AnthropicServingMessages.to_chat_completion_request`,
`responses.utils.construct_input_messages` / `construct_tool_dicts`); the prompt's tokens are those of that chat
request under the model's template. These functions follow those conversions rule by rule, on plain JSON, so the
tokenizer renders the same conversation the engine will. Malformed input raises BadRequest.
"""

from __future__ import annotations

import json
from typing import Any

from epp.framework import BadRequest
from epp.framework.keys import BILLING_HEADER_PREFIX

_CUSTOM_TOOL_INPUT_KEY = "input"


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(content, list):
        raise BadRequest(f"{where}: content must be a string or an array of content blocks")
    for j, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise BadRequest(f"{where}.content[{j}]: a content block must be an object with a type")
    return content


def _text(block: dict[str, Any], key: str = "text") -> str:
    v = block.get(key)
    return v if isinstance(v, str) else ""


def _image_url(source: Any) -> str:
    if not isinstance(source, dict):
        return ""
    if source.get("type") == "url":
        return str(source.get("url") or "")
    return f"data:{source.get('media_type') or 'image/jpeg'};base64,{source.get('data') or ''}"


def _system_text(content: Any, where: str) -> str | None:
    if isinstance(content, str):
        return None if content.startswith(BILLING_HEADER_PREFIX) else content
    parts = [_text(b) for b in _blocks(content, where) if b["type"] == "text" and _text(b)]
    kept = [t for t in parts if not t.startswith(BILLING_HEADER_PREFIX)]
    return "".join(kept) if kept else None


def anthropic_to_chat(body: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """(messages, tools) of vLLM's chat request for a /v1/messages body (inline system messages kept in place)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("invalid messages request: must have at least one message")
    out: list[dict[str, Any]] = []
    system = body.get("system")
    if system:
        if isinstance(system, str):
            out.append({"role": "system", "content": system})
        else:
            text = "".join(
                _text(b)
                for b in _blocks(system, "system")
                if b["type"] == "text" and _text(b) and not _text(b).startswith(BILLING_HEADER_PREFIX)
            )
            if text:
                out.append({"role": "system", "content": text})
    for i, msg in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise BadRequest(f"{where}: a message must be an object with a role")
        role = msg["role"]
        content = msg.get("content")
        if role == "system":
            inline = _system_text(content, where)
            if inline:
                out.append({"role": "system", "content": inline})
            continue
        converted: dict[str, Any] = {"role": role}
        if isinstance(content, str):
            converted["content"] = content
        else:
            _convert_content(_blocks(content, where), role, converted, out)
        if not (role == "user" and "content" not in converted):
            out.append(converted)
    return out, _anthropic_tools(body)


def _convert_content(blocks: list[dict[str, Any]], role: str, msg: dict[str, Any], out: list[dict[str, Any]]) -> None:
    parts: list[dict[str, Any]] = []
    tool_calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for block in blocks:
        kind = block["type"]
        if kind == "text" and _text(block):
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "image" and block.get("source"):
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block["source"])}})
        elif kind == "thinking" and isinstance(block.get("thinking"), str):
            reasoning.append(block["thinking"])
        elif kind == "tool_use":
            tool_input = block.get("input")
            tool_calls.append(
                {
                    "id": str(block.get("id") or ""),
                    "type": "function",
                    "function": {"name": str(block.get("name") or ""), "arguments": json.dumps(tool_input or {})},
                }
            )
        elif kind == "tool_result":
            if role == "user":
                _user_tool_result(block, out)
            else:
                result = block.get("content")
                parts.append({"type": "text", "text": f"Tool result: {result if result else ''}"})
    if reasoning:
        msg["reasoning"] = "".join(reasoning)
    if tool_calls:
        msg["tool_calls"] = tool_calls
    if parts:
        msg["content"] = parts[0]["text"] if len(parts) == 1 and parts[0]["type"] == "text" else parts


def _user_tool_result(block: dict[str, Any], out: list[dict[str, Any]]) -> None:
    content = block.get("content")
    text = ""
    images: list[str] = []
    refs: list[dict[str, Any]] = []
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        texts: list[str] = []
        for item in content:
            if not isinstance(item, dict):
                continue
            kind = item.get("type")
            if kind == "text":
                texts.append(str(item.get("text", "")))
            elif kind == "image":
                url = _image_url(item.get("source", {}))
                if url:
                    images.append(url)
            elif kind == "tool_reference":
                name = item.get("tool_name") or item.get("name")
                if name:
                    refs.append({"type": "tool_reference", "name": name})
        text = "\n".join(texts)
    tool_content: Any = text or ""
    if refs:
        tool_content = refs + ([{"type": "text", "text": text}] if text else [])
    out.append({"role": "tool", "tool_call_id": str(block.get("tool_use_id") or ""), "content": tool_content})
    if images:
        out.append({"role": "user", "content": [{"type": "image_url", "image_url": {"url": u}} for u in images]})


def _anthropic_tools(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    tools = body.get("tools")
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise BadRequest("tools must be an array")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise BadRequest(f"tools[{i}]: a tool must be an object with a name")
        fn: dict[str, Any] = {
            "name": tool["name"],
            "description": tool.get("description"),
            "parameters": tool.get("input_schema"),
        }
        for key in ("strict", "defer_loading"):
            if tool.get(key) is not None:
                fn[key] = tool[key]
        out.append({"type": "function", "function": fn})
    return out


def responses_to_chat(body: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """(messages, tools) of vLLM's chat rendering of a /v1/responses body (instructions, input items, tools)."""
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions:
        if not isinstance(instructions, str):
            raise BadRequest("instructions must be a string")
        messages.append({"role": "system", "content": instructions})
    inp = body.get("input")
    if isinstance(inp, str):
        messages.append({"role": "user", "content": inp})
    elif isinstance(inp, list):
        for i, item in enumerate(inp):
            msg = _response_item(item, messages[-1] if messages else None, f"input[{i}]")
            if msg is not None:
                messages.append(msg)
    else:
        raise BadRequest("input must be a string or an array of items")
    return messages, _responses_tools(body)


def _response_item(item: Any, prev: dict[str, Any] | None, where: str) -> dict[str, Any] | None:
    if not isinstance(item, dict):
        raise BadRequest(f"{where}: an input item must be an object")
    prev_assistant = prev if prev is not None and prev.get("role") == "assistant" else None
    kind = item.get("type")
    call: dict[str, Any] | None = None
    if kind == "function_call":
        name = str(item.get("name") or "")
        if item.get("namespace"):
            name = f"{item['namespace']}__{name}"  # vLLM's flat_namespace_tool_name
        call = {"id": item.get("call_id"), "function": {"name": name, "arguments": item.get("arguments")}}
    elif kind == "custom_tool_call":
        payload = json.dumps({_CUSTOM_TOOL_INPUT_KEY: item.get("input") or ""}, ensure_ascii=False)
        call = {"id": item.get("call_id"), "function": {"name": item.get("name"), "arguments": payload}}
    if call is not None:
        call["type"] = "function"
        if prev_assistant is not None and isinstance(prev_assistant.get("tool_calls", []), list):
            prev_assistant.setdefault("tool_calls", []).append(call)
            return None
        return {"role": "assistant", "tool_calls": [call]}
    if kind == "reasoning":
        if item.get("encrypted_content"):
            raise BadRequest(f"{where}: encrypted reasoning content is not supported")
        reasoning = ""
        for key in ("content", "summary"):
            seq = item.get(key)
            if isinstance(seq, list) and seq:
                first = seq[0]
                reasoning = str(first.get("text", "")) if isinstance(first, dict) else str(first)
                break
        if prev_assistant is not None and prev_assistant.get("reasoning") is None:
            prev_assistant["reasoning"] = reasoning
            return None
        return {"role": "assistant", "reasoning": reasoning}
    if kind in ("function_call_output", "custom_tool_call_output"):
        return {"role": "tool", "content": item.get("output"), "tool_call_id": item.get("call_id")}
    role = item.get("role")
    if role == "assistant":
        content = item.get("content")
        if isinstance(content, str):
            text = content
        elif isinstance(content, list) and content:
            first = content[0]
            text = str(first.get("text", "")) if isinstance(first, dict) else str(first)
        else:
            text = ""
        if prev_assistant is not None and prev_assistant.get("content") is None:
            prev_assistant["content"] = text
            return None
        return {"role": "assistant", "content": text}
    if isinstance(role, str):
        return item
    raise BadRequest(f"{where}: unsupported input item type: {str(kind)[:40]}")


def _responses_tools(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    tools = body.get("tools")
    if not tools:
        return None
    if not isinstance(tools, list):
        raise BadRequest("tools must be an array")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise BadRequest(f"tools[{i}]: a tool must be an object")
        if tool.get("type") != "function":
            continue  # built-in tools (web search, MCP...) are not rendered by the chat template
        if not isinstance(tool.get("name"), str):
            raise BadRequest(f"tools[{i}]: a function tool must have a name")
        fn: dict[str, Any] = {"name": tool["name"], "description": tool.get("description"),
                              "parameters": tool.get("parameters")}  # fmt: skip
        for key in ("strict", "defer_loading"):
            if tool.get(key) is not None:
                fn[key] = tool[key]
        out.append({"type": "function", "function": fn})
    return out
