"""token-producer `udsTokenizerConfig`: the gRPC client of llm-d-kv-cache's UDS tokenizer sidecar, against a test
TokenizationService of ours on a unix socket that renders with the real (bundled Qwen2.5) tokenizer.

The server's messages are declared here independently of the client's, in proto3 with `optional` presence, from
llm-d-kv-cache's api/tokenizerpb/tokenizer.proto (it also sends the multimodal `features` field, which the client
does not read), so a wrong field number or a lost presence bit on either side fails these tests.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, text_format

from epp.config.loader import ConfigError, parse_config
from epp.datalayer.datastore import Datastore
from epp.framework import TOKENIZED_PROMPT, ApiKind, InferenceRequest
from epp.plugins.producers.token_producer import TokenProducer
from epp.tokenization.prompt import HFBackend, PromptTokenizer
from epp.tokenization.qwen import qwen25_tokenizer_dir
from epp.tokenization.uds import UDSBackend
from epp.wiring import build_pipeline, plugin_context

PROTO = """
name: "test/tokenizer.proto" package: "tokenization" syntax: "proto3"
message_type { name: "InitializeTokenizerRequest"
  field { name: "model_name" number: 1 type: TYPE_STRING label: LABEL_OPTIONAL }
  field { name: "enable_thinking" number: 2 type: TYPE_BOOL label: LABEL_OPTIONAL }
  field { name: "add_generation_prompt" number: 3 type: TYPE_BOOL label: LABEL_OPTIONAL } }
message_type { name: "InitializeTokenizerResponse"
  field { name: "success" number: 1 type: TYPE_BOOL label: LABEL_OPTIONAL }
  field { name: "error_message" number: 2 type: TYPE_STRING label: LABEL_OPTIONAL } }
message_type { name: "ImageUrl" field { name: "url" number: 1 type: TYPE_STRING label: LABEL_OPTIONAL } }
message_type { name: "ContentPart"
  field { name: "type" number: 1 type: TYPE_STRING label: LABEL_OPTIONAL }
  field { name: "text" number: 2 type: TYPE_STRING label: LABEL_OPTIONAL oneof_index: 0 proto3_optional: true }
  field { name: "image_url" number: 3 type: TYPE_MESSAGE type_name: ".tokenization.ImageUrl" label: LABEL_OPTIONAL
          oneof_index: 1 proto3_optional: true }
  oneof_decl { name: "_text" } oneof_decl { name: "_image_url" } }
message_type { name: "ChatMessage"
  field { name: "role" number: 1 type: TYPE_STRING label: LABEL_OPTIONAL }
  field { name: "content" number: 2 type: TYPE_STRING label: LABEL_OPTIONAL oneof_index: 0 proto3_optional: true }
  field { name: "content_parts" number: 3 type: TYPE_MESSAGE type_name: ".tokenization.ContentPart"
          label: LABEL_REPEATED }
  field { name: "tool_calls_json" number: 4 type: TYPE_STRING label: LABEL_OPTIONAL oneof_index: 1
          proto3_optional: true }
  oneof_decl { name: "_content" } oneof_decl { name: "_tool_calls_json" } }
message_type { name: "RenderChatCompletionRequest"
  field { name: "model_name" number: 1 type: TYPE_STRING label: LABEL_OPTIONAL }
  field { name: "messages" number: 2 type: TYPE_MESSAGE type_name: ".tokenization.ChatMessage" label: LABEL_REPEATED }
  field { name: "tools_json" number: 3 type: TYPE_STRING label: LABEL_OPTIONAL oneof_index: 0 proto3_optional: true }
  field { name: "chat_template" number: 4 type: TYPE_STRING label: LABEL_OPTIONAL }
  field { name: "add_generation_prompt" number: 5 type: TYPE_BOOL label: LABEL_OPTIONAL oneof_index: 1
          proto3_optional: true }
  field { name: "continue_final_message" number: 6 type: TYPE_BOOL label: LABEL_OPTIONAL }
  field { name: "chat_template_kwargs" number: 7 type: TYPE_STRING label: LABEL_OPTIONAL oneof_index: 2
          proto3_optional: true }
  oneof_decl { name: "_tools_json" } oneof_decl { name: "_add_generation_prompt" }
  oneof_decl { name: "_chat_template_kwargs" } }
message_type { name: "PlaceholderRange"
  field { name: "offset" number: 1 type: TYPE_INT32 label: LABEL_OPTIONAL }
  field { name: "length" number: 2 type: TYPE_INT32 label: LABEL_OPTIONAL } }
message_type { name: "StringList" field { name: "values" number: 1 type: TYPE_STRING label: LABEL_REPEATED } }
message_type { name: "MultiModalFeatures"
  field { name: "mm_hashes" number: 1 type: TYPE_MESSAGE type_name: ".tokenization.MultiModalFeatures.MmHashesEntry"
          label: LABEL_REPEATED }
  nested_type { name: "MmHashesEntry" options { map_entry: true }
    field { name: "key" number: 1 type: TYPE_STRING label: LABEL_OPTIONAL }
    field { name: "value" number: 2 type: TYPE_MESSAGE type_name: ".tokenization.StringList" label: LABEL_OPTIONAL } } }
message_type { name: "RenderChatCompletionResponse"
  field { name: "request_id" number: 1 type: TYPE_STRING label: LABEL_OPTIONAL }
  field { name: "token_ids" number: 2 type: TYPE_UINT32 label: LABEL_REPEATED }
  field { name: "features" number: 3 type: TYPE_MESSAGE type_name: ".tokenization.MultiModalFeatures"
          label: LABEL_OPTIONAL }
  field { name: "success" number: 4 type: TYPE_BOOL label: LABEL_OPTIONAL }
  field { name: "error_message" number: 5 type: TYPE_STRING label: LABEL_OPTIONAL } }
message_type { name: "RenderCompletionRequest"
  field { name: "model_name" number: 1 type: TYPE_STRING label: LABEL_OPTIONAL }
  field { name: "prompt" number: 2 type: TYPE_STRING label: LABEL_OPTIONAL } }
message_type { name: "RenderCompletionResponse"
  field { name: "request_id" number: 1 type: TYPE_STRING label: LABEL_OPTIONAL }
  field { name: "token_ids" number: 2 type: TYPE_UINT32 label: LABEL_REPEATED }
  field { name: "success" number: 3 type: TYPE_BOOL label: LABEL_OPTIONAL }
  field { name: "error_message" number: 4 type: TYPE_STRING label: LABEL_OPTIONAL } }
"""


def _server_messages() -> dict[str, Any]:
    fd = text_format.Parse(PROTO, descriptor_pb2.FileDescriptorProto())
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return {
        m.name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"tokenization.{m.name}"))
        for m in fd.message_type
    }


S = _server_messages()
MODEL = "Qwen/Qwen2.5-0.5B-Instruct"


@dataclass
class Sidecar:
    """What llm-d-kv-cache's uds_tokenizer service does (vLLM's renderer), with the bundled tokenizer standing in for
    `MODEL`."""

    socket: str
    calls: list[tuple[str, Any]] = field(default_factory=list)
    initialized: set[str] = field(default_factory=set)
    fail_renders: bool = False
    delay: float = 0.0  # seconds a completion render takes
    in_flight: int = 0
    max_in_flight: int = 0

    def __post_init__(self) -> None:
        self.models = {MODEL, "/models/qwen"}
        self.renderer = HFBackend({m: str(qwen25_tokenizer_dir()) for m in self.models})

    def initialize(self, req: Any, ctx: Any) -> Any:
        self.calls.append(("InitializeTokenizer", req))
        if req.model_name not in self.models:
            return S["InitializeTokenizerResponse"](success=False, error_message=f"no tokenizer for {req.model_name}")
        self.initialized.add(req.model_name)
        return S["InitializeTokenizerResponse"](success=True)

    async def render_completion(self, req: Any, ctx: Any) -> Any:
        self.calls.append(("RenderCompletion", req))
        if self.fail_renders or req.model_name not in self.initialized:
            return S["RenderCompletionResponse"](success=False, error_message="not initialized")
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        await asyncio.sleep(self.delay)
        self.in_flight -= 1
        ids = await self.renderer.completion(req.model_name, req.prompt)
        return S["RenderCompletionResponse"](token_ids=ids, success=True)

    async def render_chat(self, req: Any, ctx: Any) -> Any:
        """The OpenAI chat back from the message, rendered as vLLM does (pyepp's vLLM-exact local renderer)."""
        self.calls.append(("RenderChatCompletion", req))
        if self.fail_renders or req.model_name not in self.initialized:
            return S["RenderChatCompletionResponse"](success=False, error_message="not initialized")
        messages = []
        for m in req.messages:
            msg: dict[str, Any] = {"role": m.role}
            if m.HasField("content"):
                msg["content"] = m.content
            else:
                msg["content"] = [
                    {"type": "text", "text": p.text} if p.type == "text" else {"type": p.type}
                    for p in m.content_parts
                    if p.type == "text"  # the bundled tokenizer has no image processor
                ]
            if m.HasField("tool_calls_json"):
                msg["tool_calls"] = json.loads(m.tool_calls_json)
            messages.append(msg)
        kwargs = json.loads(req.chat_template_kwargs) if req.HasField("chat_template_kwargs") else {}
        tools = json.loads(req.tools_json) if req.HasField("tools_json") else None
        assert req.HasField("add_generation_prompt") and req.add_generation_prompt  # what the renderer does anyway
        ids = await self.renderer.chat(req.model_name, messages, kwargs, tools)
        features = S["MultiModalFeatures"]()
        features.mm_hashes["image"].values.append("abc")  # a field the client skips
        return S["RenderChatCompletionResponse"](token_ids=ids, success=True, request_id="r", features=features)

    async def serve(self) -> grpc.aio.Server:
        def unary(fn: Any, req: str, resp: str) -> grpc.RpcMethodHandler:
            return grpc.unary_unary_rpc_method_handler(
                fn, request_deserializer=S[req].FromString, response_serializer=lambda m: m.SerializeToString()
            )

        handler = grpc.method_handlers_generic_handler(
            "tokenization.TokenizationService",
            {
                "InitializeTokenizer": unary(
                    self.initialize, "InitializeTokenizerRequest", "InitializeTokenizerResponse"
                ),
                "RenderCompletion": unary(
                    self.render_completion, "RenderCompletionRequest", "RenderCompletionResponse"
                ),
                "RenderChatCompletion": unary(
                    self.render_chat, "RenderChatCompletionRequest", "RenderChatCompletionResponse"
                ),
            },
        )
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((handler,))
        server.add_insecure_port(f"unix://{self.socket}")
        await server.start()
        return server


@pytest.fixture
async def sidecar() -> AsyncIterator[Sidecar]:
    d = tempfile.mkdtemp(prefix="uds", dir="/tmp")  # unix socket paths are limited to ~107 bytes
    car = Sidecar(f"{d}/tokenizer-uds.socket")
    server = await car.serve()
    yield car
    await server.stop(0)
    shutil.rmtree(d, ignore_errors=True)


def producer(socket: str, extra: str = "") -> TokenProducer:
    text = f"""plugins:
- type: token-producer
  parameters:
    modelName: {MODEL}
    udsTokenizerConfig:
      socketFile: {socket}
{extra}"""
    p = build_pipeline(parse_config(text), plugin_context(Datastore())).plugins["token-producer"]
    assert isinstance(p, TokenProducer)
    return p


CHAT: list[dict[str, Any]] = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": [{"type": "text", "text": "What is "}, {"type": "text", "text": "2+2?"}]},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{\"a\": 2, \"b\": 2}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "4"},
]  # fmt: skip
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}]


async def test_the_sidecar_renders_chats_and_prompts_as_the_local_tokenizer_does(sidecar: Sidecar) -> None:
    p = producer(sidecar.socket)
    assert p.tokenizer is not None
    await tok(p).warm()
    init = sidecar.calls[0][1]
    assert sidecar.calls[0][0] == "InitializeTokenizer" and init.model_name == MODEL and init.add_generation_prompt
    assert sidecar.calls[1][0] == "RenderChatCompletion"  # the warm-up render
    chat = InferenceRequest("c", "/v1/chat/completions", ApiKind.CHAT, "alias", MODEL, {}, messages=CHAT, tools=TOOLS)
    chat.chat_template_kwargs = {"enable_thinking": False}
    await p.prepare(chat, [])
    local = HFBackend({}, str(qwen25_tokenizer_dir()))
    want = await local.chat(MODEL, CHAT, {"enable_thinking": False}, TOOLS)
    assert chat.data.require(TOKENIZED_PROMPT).token_ids == want
    req = sidecar.calls[-1][1]
    assert req.model_name == MODEL and req.HasField("add_generation_prompt") and req.add_generation_prompt
    assert json.loads(req.tools_json) == TOOLS and json.loads(req.chat_template_kwargs) == {"enable_thinking": False}
    assert [len(m.content_parts) for m in req.messages] == [0, 2, 0, 0]
    assert json.loads(req.messages[2].tool_calls_json)[0]["function"]["name"] == "add"
    prompt = InferenceRequest("p", "/v1/completions", ApiKind.COMPLETIONS, "m", "m", {}, prompt="Hello there, world")
    await p.prepare(prompt, [])
    assert prompt.data.require(TOKENIZED_PROMPT).token_ids == await local.completion(MODEL, "Hello there, world")
    assert sidecar.calls[-1][0] == "RenderCompletion" and sidecar.calls[-1][1].model_name == MODEL


async def test_images_go_as_image_url_parts_and_other_parts_are_dropped(sidecar: Sidecar) -> None:
    p = producer(sidecar.socket)
    assert p.tokenizer is not None
    await tok(p).warm()
    content = [
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": "https://x/cat.png"}},
        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
    ]
    r = InferenceRequest(
        "i", "/v1/chat/completions", ApiKind.CHAT, "m", "m", {}, messages=[{"role": "user", "content": content}]
    )
    await p.prepare(r, [])
    parts = sidecar.calls[-1][1].messages[0].content_parts
    assert [(x.type, x.text if x.HasField("text") else x.image_url.url) for x in parts] == [
        ("text", "look"),
        ("image_url", "https://x/cat.png"),
    ]
    assert TOKENIZED_PROMPT in r.data


async def test_model_tokenizer_map_and_a_failing_sidecar(sidecar: Sidecar) -> None:
    extra = "      modelTokenizerMap: {" + MODEL + ": /models/qwen/tokenizer.json}\n"
    p = producer(sidecar.socket, extra)
    assert p.tokenizer is not None
    await tok(p).warm()
    assert sidecar.calls[0][1].model_name == "/models/qwen"  # a tokenizer.json path means its directory
    sidecar.fail_renders = True
    r = InferenceRequest("f", "/v1/completions", ApiKind.COMPLETIONS, "m", "m", {}, prompt="not cached before")
    await p.prepare(r, [])
    assert TOKENIZED_PROMPT not in r.data  # logged; scheduled without token data


async def test_an_unreachable_sidecar_is_retried_then_logged(caplog: pytest.LogCaptureFixture) -> None:
    p = producer("/tmp/no-such-dir/tokenizer-uds.socket")
    assert p.tokenizer is not None
    tok(p).backend.init_delay = 0.01  # type: ignore[attr-defined]
    await asyncio.wait_for(tok(p).warm(), 30)
    assert "failed after 5 tries" in caplog.text
    r = InferenceRequest("u", "/v1/completions", ApiKind.COMPLETIONS, "m", "m", {}, prompt="x")
    await p.prepare(r, [])
    assert TOKENIZED_PROMPT not in r.data


def tok(p: TokenProducer) -> PromptTokenizer:
    assert isinstance(p.tokenizer, PromptTokenizer)
    return p.tokenizer


CONFIGURED = "- {type: token-producer, parameters: {modelName: other, udsTokenizerConfig: {socketFile: /else}}}"


def precise(socket: str, token_producer: bool) -> dict[str, Any]:
    text = f"""plugins:
{CONFIGURED if token_producer else ""}
- type: precise-prefix-cache-scorer
  parameters:
    indexerConfig:
      tokenizersPoolConfig:
        modelName: {MODEL}
        workersCount: 2
        uds: {{socketFile: {socket}}}
      kvBlockIndexConfig: {{enableMetrics: true}}
    kvEventsConfig: {{enabled: false}}
"""
    return build_pipeline(parse_config(text), plugin_context(Datastore())).plugins


async def test_the_legacy_scorers_tokenizers_pool_config_is_the_sidecar_with_its_worker_count(
    sidecar: Sidecar, caplog: pytest.LogCaptureFixture
) -> None:
    """llm-d's precise-prefix-cache-scorer `indexerConfig.tokenizersPoolConfig` (modelName, workersCount, uds): the
    token-producer added for it asks the sidecar, at most workersCount calls at once; a configured one wins, and the
    load says the pool is unused."""
    caplog.set_level(logging.WARNING, logger="epp.wiring.builder")
    p = precise(sidecar.socket, token_producer=False)["token-producer"]
    assert not [r for r in caplog.records if "is not used" in r.getMessage()]
    assert isinstance(p, TokenProducer) and p.tokenizer is not None
    backend = tok(p).backend
    assert isinstance(backend, UDSBackend) and (backend.model, backend.max_in_flight) == (MODEL, 2)
    await tok(p).warm()
    sidecar.delay = 0.2
    reqs = [
        InferenceRequest(f"w{i}", "/v1/completions", ApiKind.COMPLETIONS, "m", "m", {}, prompt=f"p{i}")
        for i in range(6)
    ]
    await asyncio.gather(*(p.prepare(r, []) for r in reqs))
    assert all(TOKENIZED_PROMPT in r.data for r in reqs)
    assert sidecar.max_in_flight == 2
    configured = precise(sidecar.socket, token_producer=True)["token-producer"]
    assert isinstance(configured, TokenProducer) and configured.tokenizer is not None
    assert configured.tokenizer.backend.model == "other"  # type: ignore[attr-defined]
    said = [r.getMessage() for r in caplog.records if "is not used" in r.getMessage()]
    assert len(said) == 1, said
    assert said[0].startswith(
        "<text>:3: plugins[1] (precise-prefix-cache-scorer).parameters.indexerConfig.tokenizersPoolConfig is not used: "
        "token-producer 'token-producer' (plugins[0]) produces tokenized-prompt"
    ), said


def test_the_precise_producer_refuses_a_tokenizers_pool() -> None:
    text = "plugins:\n- type: precise-prefix-cache-producer\n  parameters:\n    indexerConfig:\n"
    text += "      tokenizersPoolConfig: {modelName: m}\n"
    with pytest.raises(ConfigError, match="configure a token-producer plugin instead") as ei:
        build_pipeline(parse_config(text, "p.yaml"), plugin_context(Datastore()))
    assert str(ei.value).startswith("p.yaml:5: plugins[0].parameters.indexerConfig.tokenizersPoolConfig")


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ("{udsTokenizerConfig: {socketFile: /s}}", "needs 'modelName'"),
        ("{modelName: m, vllm: {url: 'http://x'}, udsTokenizerConfig: {socketFile: /s}}", "only one of"),
        ("{modelName: m, udsTokenizerConfig: {socketFile: /s, modelTokenizerMap: {other: /p}}}", "modelTokenizerMap"),
        ("{modelName: m, udsTokenizerConfig: {socketFile: /s, socketPath: /t}}", "udsTokenizerConfig.socketPath"),
        ("{modelName: m, estimate: {}, udsTokenizerConfig: {socketFile: /s}}", "only one of"),
    ],
)
def test_configuration_errors(params: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as ei:
        build_pipeline(
            parse_config(f"plugins:\n- type: token-producer\n  parameters: {params}\n", "t.yaml"),
            plugin_context(Datastore()),
        )
    assert str(ei.value).startswith("t.yaml:")
