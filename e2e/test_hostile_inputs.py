"""What a hostile client can send through real Envoy to the EPP (issue 15, the follow-ups): bodies over the size
limit, declared or chunked, are refused with a 413 in the API's own JSON error shape.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from e2e.harness.http import Response, request
from e2e.harness.stack import start_stack

pytestmark = pytest.mark.e2e

LIMIT = 1024 * 1024


def _chunked(url: str, body: bytes, path: str) -> Response:
    """POST with Transfer-Encoding: chunked (no content-length): the EPP only learns the size by gathering."""
    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port or 80, timeout=30)

    def pieces() -> Iterator[bytes]:
        for i in range(0, len(body), 65536):
            yield body[i : i + 65536]

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
