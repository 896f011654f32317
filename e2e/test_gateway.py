"""Real Envoy → ext_proc → our EPP → ORIGINAL_DST → backend: the Endpoint Picker Protocol end to end."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from e2e.harness.backends import CACHED_TOKENS, PROMPT_TOKENS, BackendPool
from e2e.harness.http import metric_value, post_json, post_json_lines, request, sse_events, wire_request
from e2e.harness.stack import Stack, endpoints_yaml, start_stack

pytestmark = pytest.mark.e2e

DEST = "x-gateway-destination-endpoint"


@pytest.fixture(scope="module")
def duplex(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """One FULL_DUPLEX_STREAMED stack shared by the module (two backends, a model rewrite, two subset listeners)."""
    pool = BackendPool()
    bs = pool.start(2)
    s = start_stack(
        tmp_path_factory.mktemp("duplex"),
        backends=bs,
        config=lambda b: endpoints_yaml(b) + "modelRewrites:\n  alias-model: real-model\n",
        subset_hints={"only1": [bs[1].hostport], "bare-ip": [bs[0].host], "empty": [], "nomatch": ["10.9.9.9:1"]},
    )
    s.pool = pool
    yield s
    s.close()


def _echo(stack: Stack, path: str = "/v1/completions", **kw: object) -> dict[str, object]:
    body = {"model": "m1", "prompt": "hello", **kw}
    r = post_json(stack.url + path, body)
    assert r.status == 200, r.body
    return dict(r.json()["echo"])


def test_requests_reach_both_backends_round_robin(duplex: Stack) -> None:
    seen = [_echo(duplex)["backend"] for _ in range(4)]
    assert set(seen) == {b.name for b in duplex.backends}
    assert seen[0] != seen[1]


def test_backend_sees_destination_header_and_exact_body(duplex: Stack) -> None:
    body = json.dumps({"model": "m1", "prompt": "héllo ✓"}).encode()
    r = request(duplex.url + "/v1/completions", "POST", body, {"content-type": "application/json"})
    assert r.status == 200
    echo = r.json()["echo"]
    picked = next(b for b in duplex.backends if b.name == echo["backend"])
    assert echo["headers"][DEST] == picked.hostport
    assert echo["body_len"] == len(body)


def test_forged_destination_header_is_overwritten(duplex: Stack) -> None:
    forged = {DEST: "169.254.169.254:80"}
    for path, body in (("/v1/completions", {"model": "m1", "prompt": "x"}), ("/v1/chat/completions", None)):
        if body is None:
            r = request(duplex.url + "/v1/models", "GET", headers=forged)
        else:
            r = post_json(duplex.url + path, body, headers=forged)
        assert r.status == 200, r.body
        echo = r.json()["echo"]
        assert echo["headers"][DEST] in {b.hostport for b in duplex.backends}


def test_chat_completions_routed(duplex: Stack) -> None:
    r = post_json(duplex.url + "/v1/chat/completions", {"model": "m1", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status == 200
    assert r.json()["echo"]["path"] == "/v1/chat/completions"


@pytest.mark.parametrize(
    ("body", "path", "fragment"),
    [
        (b"{not json", "/v1/completions", "not valid JSON"),
        (b'{"prompt": "x"}', "/v1/completions", "model not found"),
        (b'{"model": "m1"}', "/v1/completions", "prompt not found"),
        (b'{"model": "m1", "messages": []}', "/v1/chat/completions", "at least one message"),
        (b"[1, 2]", "/v1/completions", "JSON object"),
    ],
)
def test_bad_requests_get_400_json(duplex: Stack, body: bytes, path: str, fragment: str) -> None:
    r = request(duplex.url + path, "POST", body, {"content-type": "application/json"})
    assert r.status == 400
    assert r.headers["content-type"] == "application/json"
    err = r.json()["error"]
    assert fragment in err["message"]
    assert err["code"] == 400


def test_subset_hint_restricts_the_pick(duplex: Stack) -> None:
    only = duplex.backends[1]
    for _ in range(4):
        r = post_json(duplex.subset_urls["only1"] + "/v1/completions", {"model": "m1", "prompt": "x"})
        assert r.status == 200
        assert r.json()["echo"]["backend"] == only.name


def test_subset_hint_bare_ip_matches_every_port(duplex: Stack) -> None:
    seen = set()
    for _ in range(4):
        r = post_json(duplex.subset_urls["bare-ip"] + "/v1/completions", {"model": "m1", "prompt": "x"})
        assert r.status == 200
        seen.add(r.json()["echo"]["backend"])
    assert seen == {b.name for b in duplex.backends}  # both listen on 127.0.0.1


@pytest.mark.parametrize("listener", ["empty", "nomatch"])
def test_subset_hint_empty_or_unmatched_gives_503(duplex: Stack, listener: str) -> None:
    r = post_json(duplex.subset_urls[listener] + "/v1/completions", {"model": "m1", "prompt": "x"})
    assert r.status == 503
    assert r.json()["error"]["type"] == "ServiceUnavailable"


def test_two_megabyte_prompt_streams_through(duplex: Stack) -> None:
    prompt = "abcdefghij" * 200_000
    body = json.dumps({"model": "m1", "prompt": prompt}).encode()
    r = request(duplex.url + "/v1/completions", "POST", body, {"content-type": "application/json"})
    assert r.status == 200, r.body[:200]
    echo = r.json()["echo"]
    assert echo["body_len"] == len(body)


def test_sse_streaming_through_proxy_with_usage_on_metrics(duplex: Stack) -> None:
    body = {
        "model": "sse-model",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "max_tokens": 5,
        "stream_options": {"include_usage": True},
    }
    r = post_json(duplex.url + "/v1/chat/completions", body)
    assert r.status == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.body)
    assert events[-1] == "[DONE]"
    content = [e for e in events[:-1] if e["choices"]]
    assert len(content) == 5
    assert events[-2]["usage"]["completion_tokens"] == 5
    text = duplex.epp.metrics_text()
    labels = {"model_name": "sse-model", "target_model_name": "sse-model"}
    assert metric_value(text, "inference_objective_output_tokens_sum", labels) == 5
    assert metric_value(text, "inference_objective_input_tokens_sum", labels) == PROMPT_TOKENS
    assert metric_value(text, "inference_objective_prompt_cached_tokens_sum", labels) == CACHED_TOKENS
    assert metric_value(text, "inference_objective_request_total", labels) == 1
    assert metric_value(text, "inference_objective_running_requests", {"model_name": "sse-model"}) == 0


def test_sse_chunks_arrive_as_they_are_produced(duplex: Stack) -> None:
    """The proxy path does not buffer SSE: the first event arrives well before the last (backend: 5 ms per chunk)."""
    body = {"model": "m1", "messages": [{"role": "user", "content": "x"}], "stream": True, "max_tokens": 60}
    status, lines = post_json_lines(duplex.url + "/v1/chat/completions", body)
    assert status == 200
    data = [(t, line) for t, line in lines if line.startswith(b"data: ")]
    assert len(data) == 61
    assert data[-1][0] - data[0][0] > 0.15  # 60 chunks x 5 ms, spread out on arrival


def test_json_usage_counted(duplex: Stack) -> None:
    for _ in range(2):
        r = post_json(duplex.url + "/v1/completions", {"model": "json-model", "prompt": "x", "max_tokens": 4})
        assert r.status == 200
    text = duplex.epp.metrics_text()
    labels = {"model_name": "json-model"}
    assert metric_value(text, "inference_objective_output_tokens_sum", labels) == 8
    assert metric_value(text, "inference_objective_output_tokens_count", labels) == 2
    assert metric_value(text, "inference_objective_request_duration_seconds_count", labels) == 2


def test_model_rewrite_by_config_and_back(duplex: Stack) -> None:
    r = post_json(duplex.url + "/v1/completions", {"model": "alias-model", "prompt": "x"})
    assert r.status == 200
    reply = r.json()
    assert reply["echo"]["received_model"] == "real-model"  # the backend got the target
    assert reply["model"] == "alias-model"  # the client sees its own name back
    text = duplex.epp.metrics_text()
    assert metric_value(text, "inference_objective_request_total", {"target_model_name": "real-model"}) >= 1


def test_model_rewrite_by_header_in_sse_and_back(duplex: Stack) -> None:
    body = {"model": "client-name", "messages": [{"role": "user", "content": "x"}], "stream": True, "max_tokens": 3}
    r = post_json(duplex.url + "/v1/chat/completions", body, headers={"x-gateway-model-name-rewrite": "served-name"})
    assert r.status == 200
    events = [e for e in sse_events(r.body) if e != "[DONE]"]
    assert len(events) == 3
    assert all(e["model"] == "client-name" for e in events)
    assert b"served-name" not in r.body


def test_no_endpoints_gives_503(stack_factory: Callable[..., Stack]) -> None:
    s = stack_factory(backends=0, config="endpoints: []\n")
    r = post_json(s.url + "/v1/completions", {"model": "m1", "prompt": "x"})
    assert r.status == 503
    assert r.json()["error"]["code"] == 503
    r = request(s.url + "/v1/models")
    assert r.status == 503


def test_buffered_mode(stack_factory: Callable[..., Stack]) -> None:
    s = stack_factory(backends=2, mode="BUFFERED", extra_config="modelRewrites: {a1: t1}\n")
    seen = set()
    for _ in range(2):
        r = post_json(s.url + "/v1/completions", {"model": "m1", "prompt": "x"}, headers={DEST: "10.0.0.1:1"})
        assert r.status == 200, r.body
        echo = r.json()["echo"]
        assert echo["headers"][DEST] in {b.hostport for b in s.backends}
        seen.add(echo["backend"])
    assert len(seen) == 2
    # rewritten body: the content-length must match the new body
    r = post_json(s.url + "/v1/completions", {"model": "a1", "prompt": "x"})
    assert r.status == 200
    reply = r.json()
    assert reply["echo"]["received_model"] == "t1"
    assert reply["model"] == "a1"
    assert reply["echo"]["body_len"] == len(json.dumps({"model": "t1", "prompt": "x"}, separators=(",", ":")))
    # 2 MB prompt fits because the listener buffer limit is raised
    big = json.dumps({"model": "m1", "prompt": "z" * 2_000_000}).encode()
    r = request(s.url + "/v1/completions", "POST", big, {"content-type": "application/json"})
    assert r.status == 200
    assert r.json()["echo"]["body_len"] == len(big)
    r = request(s.url + "/v1/completions", "POST", b"nope", {"content-type": "application/json"})
    assert r.status == 400
    text = s.epp.metrics_text()
    assert metric_value(text, "inference_objective_output_tokens_count", {"model_name": "m1"}) == 3


# Rewrites in both directions where the names differ in length, so rewriting the body changes its length.
LENGTH_CHANGING_REWRITES = {"tiny": "a-much-longer-target-model-name", "a-much-longer-client-model-name": "t"}


@pytest.mark.parametrize(
    ("mode", "response_mode"),
    [
        ("BUFFERED", None),
        ("FULL_DUPLEX_STREAMED", None),
        ("FULL_DUPLEX_STREAMED", "BUFFERED"),
        ("BUFFERED", "FULL_DUPLEX_STREAMED"),
    ],
)
def test_length_changing_model_rewrite_keeps_framing_right(
    stack_factory: Callable[..., Stack], mode: str, response_mode: str | None
) -> None:
    """A model rewrite that changes the body length, both ways: the backend gets a body whose length matches its
    content-length, and the client (read off the socket) a complete body that matches its content-length or
    chunked framing, valid JSON / SSE with the client's own model name, for every body-mode combination."""
    rewrites = "".join(f"  {k}: {v}\n" for k, v in LENGTH_CHANGING_REWRITES.items())
    s = stack_factory(backends=1, mode=mode, response_mode=response_mode, extra_config="modelRewrites:\n" + rewrites)
    json_ct = {"content-type": "application/json"}
    for client, target in [*LENGTH_CHANGING_REWRITES.items(), ("same-name", "same-name")]:
        body = json.dumps({"model": client, "prompt": "x"}).encode()
        r = wire_request(s.url + "/v1/completions", "POST", body, json_ct)
        assert r.status == 200, (client, r.status, r.headers, r.raw[:300])
        assert r.framing_ok, (client, r.framing_error, r.headers)
        if (response_mode or mode) == "BUFFERED":  # the whole body is known: an exact length, not chunked
            assert "content-length" in r.headers, r.headers
        reply = r.json()
        assert reply["model"] == client
        echo = reply["echo"]
        assert echo["received_model"] == target
        if "content-length" in echo["headers"]:  # the request side: the backend's framing matches its body
            assert int(echo["headers"]["content-length"]) == echo["body_len"], (client, echo["headers"])
        else:
            assert echo["headers"].get("transfer-encoding") == "chunked", echo["headers"]
        chat = {"model": client, "messages": [{"role": "user", "content": "x"}], "stream": True, "max_tokens": 3}
        r = wire_request(s.url + "/v1/chat/completions", "POST", json.dumps(chat).encode(), json_ct)
        assert r.status == 200, (client, r.status, r.headers, r.raw[:300])
        assert r.framing_ok, (client, r.framing_error, r.headers)
        events = sse_events(r.body)
        assert events[-1] == "[DONE]" and len(events) == 4
        assert all(e["model"] == client for e in events[:-1])


def test_sigterm_drain_window_then_the_in_flight_stream_finishes(stack_factory: Callable[..., Stack]) -> None:
    """llm-d-router's --drain-timeout on SIGTERM, through Envoy with a real `epp serve`: readiness goes NOT_SERVING at
    once (liveness stays SERVING); for the whole window new requests are still routed; after it the EPP refuses new
    streams while a streaming response in flight runs on to its end; then it exits 0."""
    from grpc_health.v1 import health_pb2

    window = 3.0
    s = stack_factory(backends=1, epp_args=[f"--drain-timeout={window:g}s"])
    chat = {"model": "m1", "messages": [{"role": "user", "content": "x"}], "stream": True}
    result: dict[str, object] = {}

    def run() -> None:  # ~5 ms a token at the simulator: outlasts the window
        result["r"] = post_json(s.url + "/v1/chat/completions", {**chat, "max_tokens": 1600}, timeout=60)

    t = threading.Thread(target=run)
    t.start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # wait until the request is in flight
        try:
            if metric_value(s.epp.metrics_text(), "inference_objective_running_requests", {"model_name": "m1"}) == 1:
                break
        except KeyError:
            pass
        time.sleep(0.01)
    s.epp.terminate()
    t0 = time.monotonic()
    time.sleep(0.3)
    assert s.epp.health("readiness") == health_pb2.HealthCheckResponse.NOT_SERVING
    assert s.epp.health("liveness") == health_pb2.HealthCheckResponse.SERVING
    inside = post_json(s.url + "/v1/chat/completions", {**chat, "max_tokens": 3})  # inside the window: routed
    assert inside.status == 200 and sse_events(inside.body)[-1] == "[DONE]"  # (after the window: refused, below)
    time.sleep(window + 0.5 - (time.monotonic() - t0))
    assert t.is_alive() and s.epp.running()  # past the window, the long stream still runs, so does the EPP
    after = post_json(s.url + "/v1/chat/completions", {**chat, "max_tokens": 3})
    assert after.status >= 500, after.status  # new streams are refused now (Envoy's ext_proc error)
    t.join(timeout=60)
    r = result["r"]
    assert r.status == 200  # type: ignore[attr-defined]
    events = sse_events(r.body)  # type: ignore[attr-defined]
    assert len(events) == 1601 and events[-1] == "[DONE]"
    assert s.epp.wait(10) == 0
    log_text = s.epp.log_text()
    assert "ext_proc still serving for the 3s drain window (1 streams in flight)" in log_text
    assert "refusing new streams, draining 1 streams" in log_text


def test_routing_only_envoy_ends_the_stream_before_the_response(stack_factory: Callable[..., Stack]) -> None:
    """Why the shipped Envoy config keeps the response path (measured in 297078e): with an
    ext_proc filter that sends no response messages (response headers SKIP, body NONE), Envoy 1.40 closes the
    stream once the request is routed, so the EPP would count a 3-second response as done at once and its in-flight
    load (token-load, prefill-cost, flow control) would read empty. If this ever fails, Envoy holds the stream to
    the response's end and routing-only becomes a lower-latency option."""
    s = stack_factory(backends=2, envoy_overrides={"response_path": False})
    chat = {"model": "m1", "messages": [{"role": "user", "content": "x"}], "stream": True, "max_tokens": 600,
            "stream_options": {"include_usage": True}}  # fmt: skip
    result: dict[str, object] = {}

    def run() -> None:  # ~5 ms a token at the simulator: ~3 s of streaming
        result["r"] = post_json(s.url + "/v1/chat/completions", chat, timeout=60)

    def running() -> float:
        try:
            return metric_value(s.epp.metrics_text(), "inference_objective_running_requests", {"model_name": "m1"})
        except KeyError:
            return -1.0  # not routed yet

    t = threading.Thread(target=run)
    t.start()
    deadline = time.monotonic() + 10
    while running() < 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.5)
    assert t.is_alive(), "the response should still be streaming"
    assert running() == 0  # routed and already complete for the EPP, mid-response
    t.join(timeout=60)
    r = result["r"]
    assert r.status == 200  # type: ignore[attr-defined]  # (routed: ORIGINAL_DST needs the destination header)
    assert sse_events(r.body)[-1] == "[DONE]"  # type: ignore[attr-defined]
    text = s.epp.metrics_text()
    assert metric_value(text, "inference_objective_request_total", {"model_name": "m1"}) == 1
    # usage was sent (include_usage) but never seen
    assert metric_value(text, "inference_objective_output_tokens_count", {"model_name": "m1"}) == 0


def test_concurrent_mixed_requests_all_complete(duplex: Stack) -> None:
    """64 concurrent requests (JSON, SSE, bad bodies) through one Envoy: right answers, no leaked running count."""
    from concurrent.futures import ThreadPoolExecutor

    def one(i: int) -> tuple[int, int]:
        if i % 8 == 7:
            r = request(duplex.url + "/v1/completions", "POST", b"{", {"content-type": "application/json"})
            return i, r.status
        if i % 2:
            body = {"model": "conc", "messages": [{"role": "user", "content": str(i)}], "stream": True, "max_tokens": 4}
            r = post_json(duplex.url + "/v1/chat/completions", body)
            assert len([e for e in sse_events(r.body) if e != "[DONE]"]) == 4
            return i, r.status
        r = post_json(duplex.url + "/v1/completions", {"model": "conc", "prompt": "p" * (i * 1000 + 1)})
        assert r.status == 200, (r.status, r.body[:300])
        assert r.json()["echo"]["body_len"] > i * 1000
        return i, r.status

    with ThreadPoolExecutor(max_workers=16) as ex:
        results = list(ex.map(one, range(64)))
    for i, status in results:
        assert status == (400 if i % 8 == 7 else 200), i
    text = duplex.epp.metrics_text()
    assert metric_value(text, "inference_objective_request_total", {"model_name": "conc"}) == 56
    assert metric_value(text, "inference_objective_running_requests", {"model_name": "conc"}) == 0
    assert metric_value(text, "inference_objective_request_duration_seconds_count", {"model_name": "conc"}) == 56


def test_metrics_endpoint_serves_every_part_of_the_epp(duplex: Stack) -> None:
    """Request metrics and the scheduler's / data layer's metrics (module-level, default registry) on one /metrics."""
    assert post_json(duplex.url + "/v1/completions", {"model": "m1", "prompt": "x"}).status == 200
    text = duplex.epp.metrics_text()
    for name in (
        "inference_objective_request_total",
        "inference_extension_scheduler_e2e_duration_seconds_count",
        "inference_extension_info",
        "process_cpu_seconds_total",
    ):
        assert metric_value(text, name) > 0, name


def test_buffered_request_with_streamed_response(stack_factory: Callable[..., Stack]) -> None:
    """Modes are per direction: BUFFERED request body, FULL_DUPLEX_STREAMED response (SSE + usage still work)."""
    s = stack_factory(backends=1, mode="BUFFERED", response_mode="FULL_DUPLEX_STREAMED")
    body = {
        "model": "mixed",
        "messages": [{"role": "user", "content": "x"}],
        "stream": True,
        "max_tokens": 6,
        "stream_options": {"include_usage": True},
    }
    r = post_json(s.url + "/v1/chat/completions", body)
    assert r.status == 200
    events = sse_events(r.body)
    assert events[-1] == "[DONE]" and events[-2]["usage"]["completion_tokens"] == 6
    text = s.epp.metrics_text()
    assert metric_value(text, "inference_objective_output_tokens_sum", {"model_name": "mixed"}) == 6


def test_tls_to_the_epp_self_signed(stack_factory: Callable[..., Stack]) -> None:
    """`--secure-serving`: Envoy talks TLS (h2, no verification, as GIE's configs) to a self-signed EPP."""
    s = stack_factory(backends=1, epp_args=["--secure-serving"], envoy_overrides={"ext_proc_tls": True})
    r = post_json(s.url + "/v1/completions", {"model": "m1", "prompt": "x"})
    assert r.status == 200, r.body
    assert r.json()["echo"]["backend"] == s.backends[0].name
    assert s.envoy.stats().get("cluster.ext_proc.ssl.handshake", 0) >= 1


def test_oversized_body_413_through_envoy(stack_factory: Callable[..., Stack]) -> None:
    s = stack_factory(backends=1, epp_args=["--max-request-body-bytes", "100000"])
    r = post_json(s.url + "/v1/completions", {"model": "m1", "prompt": "x" * 200_000})
    assert r.status == 413
    assert r.json()["error"]["type"] == "PayloadTooLarge"
    assert post_json(s.url + "/v1/completions", {"model": "m1", "prompt": "x" * 1000}).status == 200
