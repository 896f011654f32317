"""The official `openai` and `anthropic` SDK clients through Envoy + EPP (pyepp's default config) + simulated vLLM
pods: every API the EPP parses, streamed and not, parsed into the SDKs' own types. A follow-up Messages request
lands where its prefix is cached (the prompt was routed on its tokens, not just forwarded).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import anthropic
import openai
import pytest

from e2e.harness.simconfig import sim_endpoints_yaml
from e2e.harness.stack import Stack, start_stack
from e2e.sim.launch import start_simulators
from epp.tokenization.qwen import QWEN25_MODEL

pytestmark = pytest.mark.e2e

SYSTEM = "You are a careful travel agent. " + " ".join(f"Policy {i}: confirm dates and prices." for i in range(40))


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with start_simulators(2, base_args=["--block-size", "16", "--model", QWEN25_MODEL]) as sims:
        s = start_stack(tmp_path_factory.mktemp("sdk"), backends=[], config=sim_endpoints_yaml(sims))
        try:
            yield s
        finally:
            s.close()


@pytest.fixture(scope="module")
def oai(stack: Stack) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=stack.url + "/v1", api_key="none", max_retries=0, timeout=30) as c:
        yield c


@pytest.fixture(scope="module")
def claude(stack: Stack) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=stack.url, api_key="none", max_retries=0, timeout=30) as c:
        yield c


def test_openai_chat_completions_and_models(oai: openai.OpenAI) -> None:
    assert [m.id for m in oai.models.list()] == [QWEN25_MODEL]
    chat = oai.chat.completions.create(model=QWEN25_MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=3)
    assert chat.choices[0].message.content and chat.usage is not None and chat.usage.completion_tokens == 3
    stream = oai.chat.completions.create(
        model=QWEN25_MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=3, stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    done = oai.completions.create(model=QWEN25_MODEL, prompt="Once upon", max_tokens=2)
    assert done.choices[0].text and done.choices[0].finish_reason == "length"


def test_openai_responses_create_and_stream(oai: openai.OpenAI) -> None:
    r = oai.responses.create(model=QWEN25_MODEL, instructions=SYSTEM, input="Book Rome.")
    assert r.status == "completed" and r.output_text
    with oai.responses.stream(model=QWEN25_MODEL, instructions=SYSTEM, input="Book Oslo.") as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert deltas and final.output_text == "".join(deltas)
    assert final.usage is not None and final.usage.input_tokens_details.cached_tokens > 0  # the shared instructions


def test_anthropic_messages_create_stream_and_count_tokens(claude: anthropic.Anthropic) -> None:
    ask = [{"role": "user", "content": "Book Lisbon."}]
    m = claude.messages.create(model=QWEN25_MODEL, max_tokens=4, system=SYSTEM, messages=ask)  # type: ignore[arg-type]
    assert m.content[0].type == "text" and m.content[0].text and m.stop_reason == "max_tokens"
    time.sleep(0.3)  # the pod's KV events reach the EPP
    with claude.messages.stream(model=QWEN25_MODEL, max_tokens=4, system=SYSTEM, messages=ask) as stream:  # type: ignore[arg-type]
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text and final.content[0].type == "text" and final.content[0].text == text
    total = m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0)
    assert (final.usage.cache_read_input_tokens or 0) >= total - 16  # routed to the pod holding the prompt
    counted = claude.messages.count_tokens(model=QWEN25_MODEL, system=SYSTEM, messages=ask)  # type: ignore[arg-type]
    assert counted.input_tokens == total
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(model=QWEN25_MODEL, max_tokens=4, messages=[])
    assert isinstance(e.value.body, dict) and e.value.body["error"]["type"] == "invalid_request_error"


def test_openai_embeddings(oai: openai.OpenAI) -> None:
    r = oai.embeddings.create(model=QWEN25_MODEL, input=["first passage", "second passage"])
    assert len(r.data) == 2 and len(r.data[0].embedding) == 896 and r.usage.prompt_tokens > 0
