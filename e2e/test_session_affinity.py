"""Session affinity through Envoy: the EPP returns `x-session-token`; requests that carry it stick to that pod."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from e2e.harness.backends import Backend
from e2e.harness.http import post_json
from e2e.harness.stack import Stack

pytestmark = pytest.mark.e2e


def _config(backends: list[Backend]) -> str:
    eps = "".join(f"- {{name: {b.name}, address: {b.host}, port: {b.port}}}\n" for b in backends)
    return (
        "plugins: [{type: session-affinity-scorer}, {type: max-score-picker}]\n"
        "schedulingProfiles:\n- name: default\n  plugins:\n"
        "  - {pluginRef: session-affinity-scorer, weight: 10}\n  - {pluginRef: max-score-picker}\n"
        f"endpoints:\n{eps}"
    )


def test_session_token_returned_and_followed(stack_factory: Callable[..., Stack]) -> None:
    # session-affinity-scorer is an Alpha type in llm-d-router v0.10: it needs the flag there and here
    s = stack_factory(backends=3, config=_config, epp_args=["--allow-experimental-plugins"])
    body = {"model": "m1", "prompt": "hello"}
    first = post_json(s.url + "/v1/completions", body)
    assert first.status == 200
    token = first.headers.get("x-session-token")
    assert token, first.headers
    home = first.json()["echo"]["backend"]
    # without the token max-score-picker rotates ties, spreading requests; with it every request returns home
    spread = {post_json(s.url + "/v1/completions", body).json()["echo"]["backend"] for _ in range(3)}
    assert len(spread) > 1
    for _ in range(6):
        r = post_json(s.url + "/v1/completions", body, headers={"x-session-token": token})
        assert r.status == 200 and r.json()["echo"]["backend"] == home
