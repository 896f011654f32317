"""The Responses, Anthropic Messages (+ count_tokens) and embeddings APIs, read by the official `openai` and
`anthropic` SDKs: their typed objects and stream helpers must parse what the simulator sends."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import anthropic
import numpy as np
import openai
import pytest

from e2e.sim.launch import ThreadSim, start_in_thread
from epp.tokenization.qwen import load_qwen25_tokenizer

from .helpers import post

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
SYSTEM = "You answer in one sentence. " * 12


@pytest.fixture(scope="module")
def api() -> Iterator[ThreadSim]:
    s = start_in_thread(["--block-size", "16", "--default-max-tokens", "6"], events=False)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def oai(api: ThreadSim) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=api.url + "/v1", api_key="none", max_retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def claude(api: ThreadSim) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=api.url, api_key="none", max_retries=0) as c:
        yield c


def chat_tokens(messages: list[dict[str, Any]]) -> int:
    tok = load_qwen25_tokenizer()
    return len(tok.encode(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)))


def test_responses_create_is_a_response_object(oai: openai.OpenAI) -> None:
    r = oai.responses.create(model=MODEL, instructions=SYSTEM, input="Why is the sky blue?")
    assert r.object == "response" and r.status == "completed" and r.id.startswith("resp_")
    assert r.output_text and r.output[0].type == "message"
    assert r.usage is not None and r.usage.output_tokens == 6  # the answer's own length (--default-max-tokens)
    assert r.usage.input_tokens == chat_tokens(
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Why is the sky blue?"}]
    )
    again = oai.responses.create(model=MODEL, instructions=SYSTEM, input="Why is the sea blue?", max_output_tokens=3)
    assert again.status == "incomplete" and again.incomplete_details is not None
    assert again.incomplete_details.reason == "max_output_tokens" and again.max_output_tokens == 3
    assert again.usage is not None and again.usage.output_tokens == 3
    assert again.usage.input_tokens_details.cached_tokens >= 16  # the shared instructions


def test_responses_stream_ends_with_response_completed(oai: openai.OpenAI) -> None:
    with oai.responses.stream(model=MODEL, input=[{"role": "user", "content": "Count to three."}]) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
    ]  # fmt: skip
    assert kinds[-4:] == [
        "response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed",
    ]  # fmt: skip
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) == 6 and final.output_text == "".join(deltas)
    assert final.status == "completed" and final.usage is not None and final.usage.output_tokens == 6


def test_responses_stream_cut_by_max_output_tokens_ends_incomplete(oai: openai.OpenAI) -> None:
    stream = oai.responses.create(model=MODEL, input="Hello", max_output_tokens=2, stream=True)
    events = list(stream)
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.usage is not None and events[-1].response.usage.output_tokens == 2


def test_messages_create_has_content_blocks_and_anthropic_usage(claude: anthropic.Anthropic) -> None:
    ask = [{"role": "user", "content": "Name a colour."}]
    m = claude.messages.create(model=MODEL, max_tokens=4, system=SYSTEM, messages=ask)  # type: ignore[arg-type]
    assert m.type == "message" and m.role == "assistant" and m.stop_reason == "max_tokens"
    assert m.content[0].type == "text" and m.content[0].text
    total = chat_tokens([{"role": "system", "content": SYSTEM}, *ask])
    assert m.usage.output_tokens == 4 and m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) == total
    again = claude.messages.create(model=MODEL, max_tokens=4, system=SYSTEM, messages=ask)  # type: ignore[arg-type]
    assert again.usage.cache_read_input_tokens == (total // 16) * 16
    assert again.usage.input_tokens == total - (total // 16) * 16
    counted = claude.messages.count_tokens(model=MODEL, system=SYSTEM, messages=ask)  # type: ignore[arg-type]
    assert counted.input_tokens == total


def test_messages_stream_text_and_final_message(claude: anthropic.Anthropic) -> None:
    ask: Any = [{"role": "user", "content": [{"type": "text", "text": "Say hello."}]}]
    with claude.messages.stream(model=MODEL, max_tokens=5, messages=ask) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text and final.content[0].type == "text" and final.content[0].text == text
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 5


def test_messages_errors_are_anthropic_shaped(api: ThreadSim, claude: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(model=MODEL, max_tokens=4, messages=[])
    assert e.value.status_code == 400
    assert isinstance(e.value.body, dict) and e.value.body["type"] == "error"
    assert e.value.body["error"]["type"] == "invalid_request_error"
    status, body = post(api.url + "/v1/messages", {"model": MODEL, "messages": [{"role": "user", "content": "x"}]})
    assert (
        status == 400 and body["error"]["type"] == "invalid_request_error" and "max_tokens" in body["error"]["message"]
    )
    status, body = post(api.url + "/v1/messages/count_tokens", {"model": "no-such-model", "messages": []})
    assert status in (400, 404) and body["type"] == "error"


def test_embeddings_float_and_base64(oai: openai.OpenAI, api: ThreadSim) -> None:
    # The SDK asks for base64 and decodes it; float is what curl users get.
    r = oai.embeddings.create(model=MODEL, input=["a red apple", "a green pear"])
    assert [d.index for d in r.data] == [0, 1] and len(r.data[0].embedding) == 896
    assert abs(float(np.linalg.norm(r.data[0].embedding)) - 1.0) < 1e-5
    assert r.data[0].embedding != r.data[1].embedding
    assert r.usage.prompt_tokens == r.usage.total_tokens > 0
    floats = oai.embeddings.create(model=MODEL, input="a red apple", encoding_format="float", dimensions=8)
    again = oai.embeddings.create(model=MODEL, input="a red apple", encoding_format="float")
    assert np.allclose(again.data[0].embedding, r.data[0].embedding, atol=1e-6)  # same input, same vector
    assert len(floats.data[0].embedding) == 8
    status, raw = post(api.url + "/v1/embeddings", {"input": "a red apple", "encoding_format": "base64"})
    assert status == 200
    vec = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype="<f4")
    assert np.allclose(vec, r.data[0].embedding, atol=1e-6)
    with pytest.raises(openai.BadRequestError):
        oai.embeddings.create(model=MODEL, input="x", dimensions=5000)
    assert post(api.url + "/v1/embeddings", {"model": MODEL})[0] == 400
