"""Flow-control eviction through Envoy: a waiting high-priority request revokes an in-flight sheddable stream; the
EPP's ImmediateResponse makes Envoy reset that stream, and the freed slot serves the waiting request."""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Callable
from urllib.parse import urlsplit

import pytest

from e2e.harness.backends import Backend
from e2e.harness.http import post_json
from e2e.harness.stack import Stack

pytestmark = pytest.mark.e2e


def _config(backends: list[Backend]) -> str:
    eps = "".join(f"- {{name: {b.name}, address: {b.host}, port: {b.port}}}\n" for b in backends)
    return (
        "featureGates: [flowControl]\n"
        "plugins:\n- {type: queue-scorer}\n- {type: concurrency-detector, parameters: {maxConcurrency: 1}}\n"
        "flowControl:\n  enableEviction: true\n  defaultRequestTTL: 20s\n"
        "  saturationDetector: {pluginRef: concurrency-detector}\n"
        "objectives:\n- {name: batch, priority: -1}\n- {name: chat, priority: 5}\n"
        f"endpoints:\n{eps}"
    )


def _stream(url: str, out: dict[str, object]) -> None:
    """A long sheddable stream (2000 SSE tokens, ~10 s): how many events arrived, and how it ended."""
    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port or 80, timeout=30)
    body = {"model": "m", "prompt": "batch", "stream": True, "max_tokens": 2000}
    events = 0
    try:
        conn.request(
            "POST",
            "/v1/completions",
            body=json.dumps(body).encode(),
            headers={"content-type": "application/json", "x-gateway-inference-objective": "batch"},
        )
        r = conn.getresponse()
        out["status"] = r.status
        while True:
            line = r.readline()
            if not line:
                break
            if line.startswith(b"data: "):
                events += 1
                out["events"] = events
            if line.startswith(b"data: [DONE]"):
                out["done"] = True
    except (http.client.HTTPException, OSError) as e:
        out["error"] = type(e).__name__
    finally:
        out.setdefault("events", events)
        out["ended"] = time.monotonic()
        conn.close()


def test_a_waiting_request_evicts_a_sheddable_stream(stack_factory: Callable[..., Stack]) -> None:
    s = stack_factory(backends=1, config=_config)
    batch: dict[str, object] = {}
    t = threading.Thread(target=_stream, args=(s.url, batch), daemon=True)
    t.start()
    for _ in range(500):  # the batch stream is flowing: it holds the only slot
        if int(batch.get("events", 0)) >= 5:  # type: ignore[call-overload]
            break
        time.sleep(0.01)
    assert int(batch.get("events", 0)) >= 5, batch  # type: ignore[call-overload]
    t0 = time.monotonic()
    chat = post_json(
        s.url + "/v1/completions", {"model": "m", "prompt": "hi"}, headers={"x-gateway-inference-objective": "chat"}
    )
    waited = time.monotonic() - t0
    t.join(15)
    assert chat.status == 200, chat.body
    assert waited < 5, waited  # served once the batch stream was revoked, not after its ~10 s
    assert batch["status"] == 200 and not batch.get("done"), batch  # cut short, never finished
    assert int(batch["events"]) < 1500, batch  # type: ignore[call-overload]
