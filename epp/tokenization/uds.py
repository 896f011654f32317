"""llm-d's deprecated UDS tokenizer sidecar (`udsTokenizerConfig`): gRPC over a unix socket to llm-d-kv-cache's
`tokenization.TokenizationService` (services/uds_tokenizer), which renders with vLLM's own code.

The messages are declared here, from the field names and numbers of llm-d-kv-cache's api/tokenizerpb/tokenizer.proto
(only the fields the client uses; a proto2 declaration, so `optional` fields set to their default are still sent,
as proto3 `optional` does). Calls as llm-d-kv-cache's UdsTokenizer makes them: InitializeTokenizer(model) at
startup (5 tries, 1 s, 2 s, ... apart), a warm-up render, then RenderCompletion for prompts and
RenderChatCompletion for chats (text and image_url parts; other parts dropped; tool calls and tools as JSON;
chat_template_kwargs as JSON), 5 s a call, 30 s when a message has content parts.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from epp.framework.errors import TokenizationError

log = logging.getLogger(__name__)

SERVICE = "tokenization.TokenizationService"
DEFAULT_SOCKET = "/tmp/tokenizer/tokenizer-uds.socket"
TEXT_TIMEOUT = 5.0
MEDIA_TIMEOUT = 30.0
INIT_TRIES = 5
_MAX_MESSAGE = 100 << 20  # the Go client's send/receive limit

_F = descriptor_pb2.FieldDescriptorProto
_STRING, _BOOL, _UINT32, _MSG = _F.TYPE_STRING, _F.TYPE_BOOL, _F.TYPE_UINT32, _F.TYPE_MESSAGE
_OPT, _REP = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED

# message name -> [(field, number, type, label, message type)]
_MESSAGES: dict[str, list[tuple[str, int, int, int, str]]] = {
    "InitializeTokenizerRequest": [
        ("model_name", 1, _STRING, _OPT, ""),
        ("enable_thinking", 2, _BOOL, _OPT, ""),
        ("add_generation_prompt", 3, _BOOL, _OPT, ""),
    ],
    "InitializeTokenizerResponse": [("success", 1, _BOOL, _OPT, ""), ("error_message", 2, _STRING, _OPT, "")],
    "ImageUrl": [("url", 1, _STRING, _OPT, "")],
    "ContentPart": [
        ("type", 1, _STRING, _OPT, ""),
        ("text", 2, _STRING, _OPT, ""),
        ("image_url", 3, _MSG, _OPT, ".tokenization.ImageUrl"),
    ],
    "ChatMessage": [
        ("role", 1, _STRING, _OPT, ""),
        ("content", 2, _STRING, _OPT, ""),
        ("content_parts", 3, _MSG, _REP, ".tokenization.ContentPart"),
        ("tool_calls_json", 4, _STRING, _OPT, ""),
    ],
    "RenderChatCompletionRequest": [
        ("model_name", 1, _STRING, _OPT, ""),
        ("messages", 2, _MSG, _REP, ".tokenization.ChatMessage"),
        ("tools_json", 3, _STRING, _OPT, ""),
        ("chat_template", 4, _STRING, _OPT, ""),
        ("add_generation_prompt", 5, _BOOL, _OPT, ""),
        ("continue_final_message", 6, _BOOL, _OPT, ""),
        ("chat_template_kwargs", 7, _STRING, _OPT, ""),
    ],
    "RenderChatCompletionResponse": [  # field 3 (multimodal features) is not read
        ("request_id", 1, _STRING, _OPT, ""),
        ("token_ids", 2, _UINT32, _REP, ""),
        ("success", 4, _BOOL, _OPT, ""),
        ("error_message", 5, _STRING, _OPT, ""),
    ],
    "RenderCompletionRequest": [("model_name", 1, _STRING, _OPT, ""), ("prompt", 2, _STRING, _OPT, "")],
    "RenderCompletionResponse": [
        ("request_id", 1, _STRING, _OPT, ""),
        ("token_ids", 2, _UINT32, _REP, ""),
        ("success", 3, _BOOL, _OPT, ""),
        ("error_message", 4, _STRING, _OPT, ""),
    ],
}


def _messages() -> dict[str, Any]:
    fd = descriptor_pb2.FileDescriptorProto(name="pyepp/uds_tokenizer.proto", package="tokenization", syntax="proto2")
    for name, fields in _MESSAGES.items():
        msg = fd.message_type.add(name=name)
        for field, number, kind, label, type_name in fields:
            f = msg.field.add(name=field, number=number, type=kind, label=label)
            if type_name:
                f.type_name = type_name
            if kind == _UINT32 and label == _REP:
                f.options.packed = True  # proto3's encoding of repeated scalars
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"tokenization.{name}")) for name in _MESSAGES
    }


PB = _messages()


def resolve_model(model: str, tokenizer_map: Mapping[str, str]) -> str:
    """llm-d-kv-cache's modelTokenizerMap: the model's entry (a tokenizer.json path means its directory)."""
    if not tokenizer_map:
        return model
    path = tokenizer_map.get(model)
    if path is None:
        raise ValueError(f"tokenizer for model {model!r} not found in modelTokenizerMap")
    p = PurePosixPath(path)
    return str(p.parent) if p.name == "tokenizer.json" else path


def chat_messages(messages: list[dict[str, Any]]) -> list[Any]:
    """OpenAI chat messages as ChatMessage: text content, or text/image_url parts (others dropped)."""
    out = []
    for m in messages:
        msg = PB["ChatMessage"](role=str(m.get("role") or ""))
        if m.get("tool_calls"):
            msg.tool_calls_json = json.dumps(m["tool_calls"], separators=(",", ":"))
        content = m.get("content")
        if isinstance(content, list) and content:
            for part in content:
                if not isinstance(part, dict):
                    continue
                kind = part.get("type")
                if kind == "text":
                    msg.content_parts.add(type="text", text=str(part.get("text") or ""))
                elif kind == "image_url":
                    url = part.get("image_url")
                    url = url.get("url") if isinstance(url, dict) else url
                    msg.content_parts.add(type="image_url", image_url=PB["ImageUrl"](url=str(url or "")))
        else:
            msg.content = content if isinstance(content, str) else ""
        out.append(msg)
    return out


class UDSBackend:
    """A PromptTokenizer backend on the sidecar; `model` (llm-d's modelName, resolved) is what every call names."""

    renders_media = True

    def __init__(self, socket_file: str, model: str, *, use_tcp: bool = False, max_in_flight: int = 0) -> None:
        import grpc

        self.target = socket_file if use_tcp else f"unix://{socket_file}"
        self.model = model
        opts = [("grpc.max_send_message_length", _MAX_MESSAGE), ("grpc.max_receive_message_length", _MAX_MESSAGE)]
        opts += [("grpc.keepalive_time_ms", 600_000), ("grpc.keepalive_timeout_ms", 10_000)]
        opts += [("grpc.keepalive_permit_without_calls", 1)]
        self._options = opts
        self._channel: grpc.aio.Channel | None = None
        self._grpc = grpc
        self.init_delay = 1.0  # seconds before the second InitializeTokenizer try (then 2, 3, 4)
        # llm-d-kv-cache's pool runs `workersCount` calls at once; 0: no limit of ours
        self._slots = asyncio.Semaphore(max_in_flight) if max_in_flight > 0 else None
        self.max_in_flight = max_in_flight

    def _call(self, method: str, request: Any, response: str, timeout: float) -> Any:
        if self._channel is None:
            self._channel = self._grpc.aio.insecure_channel(self.target, options=self._options)
        rpc: Any = self._channel.unary_unary(
            f"/{SERVICE}/{method}",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=PB[response].FromString,
        )
        return rpc(request, timeout=timeout)

    async def _rpc(self, method: str, request: Any, response: str, timeout: float) -> Any:
        try:
            if self._slots is None:
                reply = await self._call(method, request, response, timeout)
            else:
                async with self._slots:
                    reply = await self._call(method, request, response, timeout)
        except self._grpc.aio.AioRpcError as e:
            raise TokenizationError(f"uds tokenizer {self.target}: {method}: {e.code().name}: {e.details()}") from None
        if not reply.success:
            raise TokenizationError(f"uds tokenizer {self.target}: {method} failed: {reply.error_message[:200]}")
        return reply

    async def warm(self) -> None:
        """InitializeTokenizer (retried), then a best-effort warm-up render, as the Go client does at startup."""
        req = PB["InitializeTokenizerRequest"](model_name=self.model, enable_thinking=False, add_generation_prompt=True)
        last: Exception | None = None
        for i in range(INIT_TRIES):
            if i:
                await asyncio.sleep(i * self.init_delay)
            try:
                await self._rpc("InitializeTokenizer", req, "InitializeTokenizerResponse", TEXT_TIMEOUT)
                break
            except TokenizationError as e:
                last = e
        else:
            log.error("uds tokenizer: initializing %r failed after %d tries: %s", self.model, INIT_TRIES, last)
            return
        try:
            await self.chat(self.model, [{"role": "user", "content": "warmup"}], {})
        except TokenizationError as e:
            log.debug("uds tokenizer warm-up render failed (non-critical): %s", e)

    async def completion(self, model: str, prompt: str) -> list[int]:
        req = PB["RenderCompletionRequest"](model_name=self.model, prompt=prompt)
        return list((await self._rpc("RenderCompletion", req, "RenderCompletionResponse", TEXT_TIMEOUT)).token_ids)

    async def chat(
        self,
        model: str,
        messages: list[dict[str, Any]],
        kwargs: Mapping[str, Any],
        tools: list[dict[str, Any]] | None = None,
    ) -> list[int]:
        msgs = chat_messages(messages)
        req = PB["RenderChatCompletionRequest"](model_name=self.model, add_generation_prompt=True)
        req.messages.extend(msgs)
        if tools:
            req.tools_json = json.dumps(tools, separators=(",", ":"))
        if kwargs:
            req.chat_template_kwargs = json.dumps(dict(kwargs), separators=(",", ":"))
        timeout = MEDIA_TIMEOUT if any(len(m.content_parts) for m in msgs) else TEXT_TIMEOUT
        reply = await self._rpc("RenderChatCompletion", req, "RenderChatCompletionResponse", timeout)
        return list(reply.token_ids)

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
