"""`make demo` (first version): Envoy + pyepp + two tiny backends on loopback; routes a few requests and prints them.

Run: `python -m e2e.demo` from the repo root. Everything binds 127.0.0.1 on free ports and is stopped at the end.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from e2e.harness.http import metric_value, post_json, request, sse_events
from e2e.harness.stack import start_stack


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="pyepp-demo-") as tmp:
        stack = start_stack(Path(tmp), backends=2, extra_config="modelRewrites:\n  my-alias: qwen2.5-0.5b\n")
        try:
            print(f"gateway {stack.url}  (EPP metrics {stack.epp.metrics_url})")
            for b in stack.backends:
                print(f"  backend {b.name} at {b.hostport}")
            print()
            for i in range(3):
                r = post_json(stack.url + "/v1/completions", {"model": "qwen2.5-0.5b", "prompt": f"request {i}"})
                print(f"POST /v1/completions #{i} -> {r.status} served by {r.json()['echo']['backend']}")
            r = post_json(
                stack.url + "/v1/completions",
                {"model": "qwen2.5-0.5b", "prompt": "x"},
                headers={"x-gateway-destination-endpoint": "169.254.169.254:80"},
            )
            echo = r.json()["echo"]
            seen = echo["headers"]["x-gateway-destination-endpoint"]
            print(f"forged destination header -> {r.status}, backend saw {seen}")
            r = post_json(stack.url + "/v1/completions", {"model": "my-alias", "prompt": "x"})
            reply = r.json()
            got, back = reply["echo"]["received_model"], reply["model"]
            print(f"model rewrite my-alias -> backend got {got!r}, client sees {back!r}")
            body = {
                "model": "qwen2.5-0.5b",
                "messages": [{"role": "user", "content": "stream please"}],
                "stream": True,
                "max_tokens": 4,
                "stream_options": {"include_usage": True},
            }
            r = post_json(stack.url + "/v1/chat/completions", body)
            events = sse_events(r.body)
            backend = events[0]["backend"]
            print(f"SSE chat -> {r.status}, {len(events) - 2} chunks + usage from {backend}: {events[-2]['usage']}")
            r = request(stack.url + "/v1/completions", "POST", b"{oops", {"content-type": "application/json"})
            print(f"bad JSON -> {r.status} {json.loads(r.body)['error']['message']}")
            text = stack.epp.metrics_text()
            total = metric_value(text, "inference_objective_request_total")
            out_tokens = metric_value(text, "inference_objective_output_tokens_sum")
            print(f"\nEPP /metrics: inference_objective_request_total={total:g} output_tokens_sum={out_tokens:g}")
        finally:
            stack.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
