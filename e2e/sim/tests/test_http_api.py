"""The OpenAI-compatible HTTP API, /tokenize, render endpoints and error shapes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from e2e.sim.launch import ThreadSim, start_in_thread
from epp.tokenization.qwen import load_qwen25_tokenizer

from .helpers import get, post, stream_ttft

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name three rivers of Europe and their lengths, please."},
]


@pytest.fixture(scope="module")
def api() -> Iterator[ThreadSim]:
    s = start_in_thread(["--lora-modules", "sql-lora=/adapters/sql", "--max-model-len", "2048"], events=False)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def tok() -> Any:
    return load_qwen25_tokenizer()


def test_tokenize_matches_the_epp_tokenizer(api: ThreadSim, tok: Any) -> None:
    prompt = "Héllo wörld, <|im_start|> and some code: def f(x): return x**2\n"
    status, body = post(api.url + "/tokenize", {"model": MODEL, "prompt": prompt})
    assert status == 200
    assert body["tokens"] == tok.encode(prompt) and body["count"] == len(body["tokens"])
    assert body["max_model_len"] == 2048 and body["token_strs"] is None
    status, body = post(api.url + "/tokenize", {"model": MODEL, "messages": MESSAGES})
    want = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert body["tokens"] == tok.encode(want, add_special_tokens=False)
    assert body["tokens"][-3:] == [151644, 77091, 198]  # "<|im_start|>assistant\n"
    _, body2 = post(api.url + "/tokenize", {"messages": MESSAGES, "add_generation_prompt": False})
    assert body2["tokens"] == body["tokens"][:-3]
    _, strs = post(api.url + "/tokenize", {"prompt": "Hello world", "return_token_strs": True})
    assert strs["token_strs"] == ["Hello", "Ġworld"]
    status, de = post(api.url + "/detokenize", {"tokens": tok.encode(prompt)})
    assert status == 200 and de["prompt"] == prompt


def test_chat_prompt_tokens_equal_the_chat_template(api: ThreadSim, tok: Any) -> None:
    status, body = post(api.url + "/v1/chat/completions", {"model": MODEL, "messages": MESSAGES, "max_tokens": 7})
    assert status == 200
    ids = tok.encode(tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False))
    assert body["usage"]["prompt_tokens"] == len(ids)
    assert body["usage"]["completion_tokens"] == 7 and body["usage"]["total_tokens"] == len(ids) + 7
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    (choice,) = body["choices"]
    assert choice["message"]["role"] == "assistant" and choice["message"]["content"]
    assert choice["finish_reason"] == "length"


def test_completion_prefix_cache_hits_in_usage(api: ThreadSim) -> None:
    prompt = "A long shared preamble about the weather in many cities. " * 10
    _, first = post(api.url + "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 3})
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    _, again = post(api.url + "/v1/completions", {"model": MODEL, "prompt": prompt + " And Paris?", "max_tokens": 3})
    cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached == (first["usage"]["prompt_tokens"] // 16) * 16 > 0
    assert again["choices"][0]["text"] and again["object"] == "text_completion"
    # token-id prompts hit the same cache entries
    ids = load_qwen25_tokenizer().encode(prompt)
    _, by_ids = post(api.url + "/v1/completions", {"model": MODEL, "prompt": ids, "max_tokens": 1})
    assert by_ids["usage"]["prompt_tokens_details"]["cached_tokens"] == cached


@pytest.mark.parametrize("chat", [False, True])
def test_streaming_with_usage(api: ThreadSim, chat: bool) -> None:
    path = "/v1/chat/completions" if chat else "/v1/completions"
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 4, "stream_options": {"include_usage": True}}
    body.update({"messages": MESSAGES} if chat else {"prompt": "Once upon a time"})
    _, chunks = stream_ttft(api.url + path, body)
    assert chunks[-1] == {"done": True}
    usage = chunks[-2]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 4
    assert "cached_tokens" in usage["usage"]["prompt_tokens_details"]
    content = chunks[:-2]
    if chat:
        assert content[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        content = content[1:]
        assert all(c["object"] == "chat.completion.chunk" for c in chunks[:-1])
    assert len(content) == 4
    assert [c["choices"][0]["finish_reason"] for c in content] == [None, None, None, "length"]
    # without include_usage: no usage chunk
    body.pop("stream_options")
    _, plain = stream_ttft(api.url + path, body)
    assert all("usage" not in c for c in plain)


def test_models_lists_base_and_lora(api: ThreadSim) -> None:
    status, raw = get(api.url + "/v1/models")
    assert status == 200
    import json

    data = json.loads(raw)["data"]
    assert [m["id"] for m in data] == [MODEL, "sql-lora"]
    assert data[1]["parent"] == MODEL and data[1]["root"] == "/adapters/sql"
    assert data[0]["max_model_len"] == 2048


def test_lora_request_served(api: ThreadSim) -> None:
    status, body = post(api.url + "/v1/completions", {"model": "sql-lora", "prompt": "SELECT", "max_tokens": 2})
    assert status == 200 and body["model"] == "sql-lora"


def test_render_endpoints(api: ThreadSim, tok: Any) -> None:
    status, body = post(
        api.url + "/v1/chat/completions/render", {"model": MODEL, "messages": MESSAGES, "max_tokens": 5}
    )
    assert status == 200
    want = tok.encode(tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False))
    assert body["token_ids"] == want and body["model"] == MODEL
    assert body["sampling_params"]["max_tokens"] == 5 and body["request_id"]
    status, body = post(api.url + "/v1/completions/render", {"model": MODEL, "prompt": ["one two", "three"]})
    assert status == 200 and [r["token_ids"] for r in body] == [tok.encode("one two"), tok.encode("three")]


@pytest.mark.parametrize(
    ("path", "body", "status", "needle"),
    [
        ("/v1/completions", b"{not json", 400, "Invalid JSON"),
        ("/v1/completions", [1, 2], 400, "JSON object"),
        ("/v1/completions", {"model": "nope", "prompt": "x"}, 404, "does not exist"),
        ("/v1/completions", {"prompt": ""}, 400, "prompt"),
        ("/v1/completions", {"prompt": [1, -5]}, 400, "out of vocabulary"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 5000}, 400, "maximum context length"),
        ("/v1/chat/completions", {"messages": []}, 400, "messages"),
        ("/v1/chat/completions", {"messages": [{"content": "hi"}]}, 400, "role"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, 400, "content"),
        ("/v1/chat/completions", {"messages": [{"role": "user"}], "chat_template_kwargs": "x"}, 400, "kwargs"),
        ("/v1/completions", {"prompt": "x", "stream": True, "stream_options": "yes"}, 400, "stream_options"),
        ("/v1/completions", {"prompt": "x", "cache_salt": 3}, 400, "cache_salt"),
        ("/v1/completions", {"prompt": "x", "n": 2}, 400, "n=1"),
        ("/tokenize", {}, 400, "prompt"),
        ("/detokenize", {"tokens": "abc"}, 400, "integers"),
    ],
)
def test_bad_requests_get_openai_error_bodies(api: ThreadSim, path: str, body: Any, status: int, needle: str) -> None:
    got, err = post(api.url + path, body)
    assert got == status
    assert needle in err["error"]["message"] and err["error"]["code"] == status and err["error"]["type"]


def test_response_headers_name_the_pod(api: ThreadSim) -> None:
    import urllib.request

    req = urllib.request.Request(api.url + "/v1/completions", data=b'{"prompt":"hi","max_tokens":1}')
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req) as r:
        assert r.headers["x-inference-port"] == str(api.http_port)
        assert r.headers["x-inference-pod"] == f"sim-{api.http_port}"
