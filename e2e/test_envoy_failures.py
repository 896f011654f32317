"""What clients see when Envoy itself answers: overload, the EPP down, a body too large (issue 15 item 7).

Before: the ext_proc cluster kept Envoy's default circuit breaker (1,024 requests) and overload came back as bare
500s with empty bodies; Envoy's own errors were plain text. Now every such answer is a 503 (or 413) with an
OpenAI-style JSON error body, and the EPP's own JSON errors pass unchanged.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from e2e.harness.http import Response, post_json, request
from e2e.harness.stack import start_stack

pytestmark = pytest.mark.e2e


def error_of(r: Response) -> dict[str, object]:
    assert r.headers.get("content-type", "").startswith("application/json"), (r.status, r.headers, r.body[:200])
    err = json.loads(r.body)["error"]
    assert isinstance(err, dict) and err["code"] == r.status and err["message"], err
    return err


def test_overload_and_a_dead_epp_answer_json_503(tmp_path: Path) -> None:
    stack = start_stack(tmp_path, backends=2, envoy_overrides={"ext_proc_max_streams": 4})
    try:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 200}

        def one(_: int) -> Response:
            return post_json(stack.url + "/v1/chat/completions", body, timeout=30)

        with ThreadPoolExecutor(16) as ex:
            results = list(ex.map(one, range(16)))
        statuses = sorted(r.status for r in results)
        assert 200 in statuses and 503 in statuses and set(statuses) <= {200, 503}, statuses
        for r in results:
            if r.status == 503:
                assert error_of(r) == {
                    "message": "the endpoint picker is unavailable or overloaded",
                    "type": "ServiceUnavailable",
                    "code": 503,
                }
        # The EPP's own errors keep their body (not re-wrapped by Envoy's local-reply mapping).
        r = post_json(stack.url + "/v1/chat/completions", {"model": "m"})
        assert r.status == 400 and error_of(r)["type"] == "BadRequest"
        # The EPP down: 503 with a JSON body, not a bare 500.
        stack.epp.stop()
        r = post_json(stack.url + "/v1/chat/completions", {**body, "stream": False})
        assert r.status == 503
        error_of(r)
    finally:
        stack.close()


def test_buffered_body_over_the_limit_is_a_json_413(tmp_path: Path) -> None:
    stack = start_stack(tmp_path, backends=1, mode="BUFFERED", envoy_overrides={"per_connection_buffer_limit": 65536})
    try:
        big = json.dumps({"model": "m", "prompt": "x" * 200_000}).encode()
        r = request(stack.url + "/v1/completions", "POST", big, {"content-type": "application/json"})
        assert r.status == 413
        error_of(r)
    finally:
        stack.close()
