"""request-attribute-reporter: CEL over the response usage → dynamic metadata (the server test sends it)."""

from __future__ import annotations

import pytest

from epp.framework import ApiKind, InferenceRequest, PluginConfigError, Usage
from epp.framework.attributes import RESPONSE_METADATA
from epp.plugins.requestcontrol.request_attribute_reporter import RequestAttributeReporter
from tests.helpers import build


def reporter(expression: str, condition: str = "", namespace: str = "") -> RequestAttributeReporter:
    key = {"name": "x-gateway-inference-request-cost"} | ({"namespace": namespace} if namespace else {})
    attr = {"key": key, "expression": expression} | ({"condition": condition} if condition else {})
    return build(RequestAttributeReporter, {"attributes": [attr]})


def req() -> InferenceRequest:
    return InferenceRequest("r", "/v1/completions", ApiKind.COMPLETIONS, "m", "m", {})


def test_expression_condition_and_namespace() -> None:
    r = reporter("usage.prompt_tokens + usage.completion_tokens", "has(usage.completion_tokens)", "custom.ns")
    q = req()
    r.response_complete(q, None, Usage(prompt_tokens=10, completion_tokens=5, total_tokens=15))
    assert q.data.get(RESPONSE_METADATA) == {"custom.ns": {"x-gateway-inference-request-cost": 15.0}}
    cached = reporter("has(usage.prompt_tokens_details) ? usage.prompt_tokens_details.cached_tokens : 0")
    assert cached.value(Usage(prompt_tokens=10, cached_tokens=8)) == 8
    assert cached.value(Usage(prompt_tokens=10)) is None  # zero is not reported
    gated = reporter("usage.total_tokens", "usage.total_tokens > 100")
    assert gated.value(Usage(total_tokens=50)) is None and gated.value(Usage(total_tokens=150)) == 150
    assert reporter("usage.prompt_tokens").value(None) is None  # no usage: zeros


def test_a_non_integer_result_is_not_reported() -> None:
    assert reporter("'text'").value(Usage(prompt_tokens=1)) is None
    assert reporter("usage.prompt_tokens > 0").value(Usage(prompt_tokens=1)) is None


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ({"attributes": []}, "exactly one entry"),
        ({"attributes": [{"key": {"name": "k"}, "expression": "usage.("}]}, "invalid CEL expression"),
        ({"attributes": [{"key": {}, "expression": "1"}]}, "'attributes\\[0\\].key.name': required"),
        ({"attributes": [{"key": {"name": "k"}, "expression": "1", "when": "x"}]}, "unknown parameter 'attributes"),
    ],
)
def test_bad_parameters(params: dict[str, object], match: str) -> None:
    with pytest.raises(PluginConfigError, match=match):
        build(RequestAttributeReporter, params)


def test_a_director_with_the_reporter_completes_before_the_last_answer() -> None:
    """Its metadata goes out with the last body answer, so the servicer must not defer completion past it."""
    from epp.config import parse_config
    from epp.wiring.runtime import build_runtime

    base = "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n"
    reporter = (
        "- type: request-attribute-reporter\n  parameters:\n    attributes:\n"
        "    - key: {name: x-cost}\n      expression: usage.prompt_tokens\n"
    )
    tail = "- type: random-picker\nschedulingProfiles:\n- name: default\n  plugins:\n  - pluginRef: random-picker\n"
    with_it = build_runtime(parse_config(base + reporter + tail, source="t"))
    without = build_runtime(parse_config(base + tail, source="t"))
    assert with_it.director.completes_before_last_answer
    assert not without.director.completes_before_last_answer
