"""What a hostile client can send through real Envoy to the EPP (issue 15, the follow-ups): bodies over the size
limit, declared or chunked, are refused with a 413 in the API's own JSON error shape; header floods, dribbled
bodies, giant tool arrays and deep or wide content parts are routed or refused with a JSON 4xx, never a 500.
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from e2e.harness.backends import Backend
from e2e.harness.http import Response, request
from e2e.harness.stack import endpoints_yaml, start_stack

pytestmark = pytest.mark.e2e

LIMIT = 1024 * 1024


def endpoints_section(backends: list[Backend]) -> str:
    """The `endpoints:` part of the kit's static config (its round-robin profile dropped)."""
    text = endpoints_yaml(backends)
    return text[text.index("endpoints:") :]


def _chunked(url: str, body: bytes, path: str, piece: int = 65536) -> Response:
    """POST with Transfer-Encoding: chunked (no content-length): the EPP only learns the size by gathering."""
    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port or 80, timeout=30)

    def pieces() -> Iterator[bytes]:
        for i in range(0, len(body), piece):
            yield body[i : i + piece]

    try:
        conn.request("POST", path, body=pieces(), headers={"content-type": "application/json"}, encode_chunked=True)
        r = conn.getresponse()
        return Response(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
    except (BrokenPipeError, ConnectionResetError) as e:  # Envoy may answer and close before the body is sent
        raise AssertionError(f"connection closed before an answer: {e}") from None
    finally:
        conn.close()


def test_bodies_over_the_limit_get_413_in_the_apis_shape(tmp_path: Path) -> None:
    stack = start_stack(tmp_path, backends=1, epp_args=["--max-request-body-bytes", str(LIMIT)])
    try:
        text = "x" * (LIMIT + 1000)
        chat = json.dumps({"model": "m", "messages": [{"role": "user", "content": text}]}).encode()
        messages = json.dumps({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": text}]}).encode()
        ct = {"content-type": "application/json"}
        for send in ("declared", "chunked"):
            for path, body, shape in (
                ("/v1/chat/completions", chat, "openai"),
                ("/v1/messages", messages, "anthropic"),
            ):
                if send == "declared":
                    r = request(stack.url + path, "POST", body, ct)
                else:
                    r = _chunked(stack.url, body, path)
                assert r.status == 413, (send, path, r.status, r.body[:300])
                assert r.headers["content-type"].startswith("application/json"), r.headers
                err = json.loads(r.body)
                if shape == "anthropic":
                    assert err["type"] == "error" and err["error"]["type"] == "request_too_large", err
                else:
                    assert err["error"]["code"] == 413, err
                assert f"request body exceeds {LIMIT} bytes" in r.body.decode()
        # Just under the limit still routes, both ways.
        ok = json.dumps({"model": "m", "prompt": "y" * (LIMIT - 100)}).encode()
        assert request(stack.url + "/v1/completions", "POST", ok, ct).status == 200
        assert _chunked(stack.url, ok, "/v1/completions").status == 200
    finally:
        stack.close()


def _timed(fn: Callable[[], Response]) -> tuple[Response, float]:
    t = time.monotonic()
    r = fn()
    return r, time.monotonic() - t


def test_hostile_shapes_get_a_decision_or_a_json_4xx(tmp_path: Path) -> None:
    """Request shapes a hostile client can send, through Envoy and the EPP with GIE's default profile (the
    approximate prefix producer reads the prompt): each is routed or refused with a JSON 4xx, never a 500, and
    a small request right after is still served."""
    config = (
        "plugins: [{type: prefix-cache-scorer}, {type: kv-cache-utilization-scorer}, {type: queue-scorer}]\n"
        "schedulingProfiles: [{name: default, plugins: [{pluginRef: prefix-cache-scorer, weight: 3},"
        " {pluginRef: kv-cache-utilization-scorer, weight: 2}, {pluginRef: queue-scorer, weight: 2}]}]\n"
    )
    stack = start_stack(tmp_path, backends=2, config=lambda bs: config + endpoints_section(bs))
    ct = {"content-type": "application/json"}
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    took: dict[str, float] = {}

    def post(path: str, body: object, headers: dict[str, str] | None = None) -> Response:
        return request(stack.url + path, "POST", json.dumps(body).encode(), {**ct, **(headers or {})}, timeout=60)

    def small_ok() -> None:
        assert post("/v1/chat/completions", chat).status == 200

    try:
        # Headers within Envoy's limits (100 headers, 60 KiB) that the EPP's routing headers push over them: Envoy
        # refuses the mutation; a JSON 431 (it was a 503 that blamed nothing).
        r = post("/v1/chat/completions", chat, {f"x-h{i}": "v" for i in range(95)})
        err = json.loads(r.body)["error"]
        assert (r.status, err["code"], err["type"]) == (431, 431, "RequestHeaderFieldsTooLarge"), r.body[:300]
        # Many headers, and long ones, within Envoy's limits with room for the EPP's: routed.
        many = {f"x-h{i}": "v" * 500 for i in range(80)}
        r, took["80 headers of 500 B"] = _timed(lambda: post("/v1/chat/completions", chat, many))
        assert r.status == 200, r.body[:200]
        long = {"x-request-id": "r" * 8_000, "x-gateway-inference-fairness-id": "f" * 5_000}
        r, took["8 KB request id"] = _timed(lambda: post("/v1/chat/completions", chat, long))
        assert r.status == 200, r.body[:200]
        small_ok()
        # A body dribbled in tiny pieces: every piece is its own HTTP chunk.
        body = json.dumps({"model": "m", "prompt": "x" * 16_000, "max_tokens": 1}).encode()
        r, took["16 KB in 16-byte chunks"] = _timed(lambda: _chunked(stack.url, body, "/v1/completions", piece=16))
        assert r.status == 200, r.body[:200]
        # A giant tools array (chat) and as many function tools on the Responses API (converted to chat tools).
        tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
        r, took["chat, 20k tools"] = _timed(lambda: post("/v1/chat/completions", {**chat, "tools": [tool] * 20_000}))
        assert r.status == 200, r.body[:200]
        rtool = {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}
        responses = {"model": "m", "input": "hi", "tools": [rtool] * 20_000, "max_output_tokens": 1}
        r, took["responses, 20k tools"] = _timed(lambda: post("/v1/responses", responses))
        assert r.status == 200, r.body[:200]

        # Content parts nested deep (each wrap is a list and an object: 2 JSON levels; the message adds 3 more):
        # 62 wraps stay within the 128-level limit, 63 do not; and very many parts side by side (Messages API).
        def wrapped(n: int) -> object:
            nested: object = "x"
            for _ in range(n):
                nested = [{"type": "text", "text": "x", "content": nested}]
            return nested

        msg = {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": wrapped(62)}]}
        r = post("/v1/messages", msg)
        assert r.status == 200, (r.status, r.body[:200])
        r = post("/v1/messages", {**msg, "messages": [{"role": "user", "content": wrapped(63)}]})
        assert r.status == 400 and json.loads(r.body)["type"] == "error", (r.status, r.body[:200])
        assert "nests deeper than 128 levels" in r.body.decode()
        parts = [{"type": "text", "text": "x"}] * 200_000
        r, took["messages, 200k content parts"] = _timed(
            lambda: post("/v1/messages", {**msg, "messages": [{"role": "user", "content": parts}]})
        )
        assert r.status == 200, r.body[:200]
        r = post("/v1/responses", {"model": "m", "input": [{"role": "user", "content": parts}]})
        assert r.status == 200, r.body[:200]
        small_ok()
        print("seconds per request:", {k: round(v, 2) for k, v in took.items()})
    finally:
        stack.close()


def test_bodies_that_never_finish_get_a_408_and_free_their_streams(tmp_path: Path) -> None:
    """200 connections send headers and part of a body, then nothing: each used to hold an EPP stream until
    Envoy's 300 s idle timeout. With --request-body-timeout 1s each gets a 408 in the API's error shape."""
    import socket

    stack = start_stack(tmp_path, backends=1, epp_args=["--request-body-timeout", "1s"])
    try:
        u = urlsplit(stack.url)
        socks = []
        for i in range(200):
            s = socket.create_connection((u.hostname, u.port), timeout=10)
            path = "/v1/messages" if i % 2 else "/v1/completions"
            s.sendall(
                f"POST {path} HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
                '{"model": "m", "prompt": "'.encode()
            )
            socks.append((s, path))
        t0 = time.monotonic()
        statuses = []
        for s, path in socks:
            data = b""
            while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
            s.close()
            head, _, body = data.partition(b"\r\n\r\n")
            statuses.append(int(head.split()[1]))
            shape = json.loads(body[body.index(b"{") :])
            assert ("type" in shape) if path == "/v1/messages" else ("error" in shape), body
        assert statuses == [408] * 200
        assert time.monotonic() - t0 < 10
    finally:
        stack.close()
