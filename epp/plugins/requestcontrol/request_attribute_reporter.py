"""request-attribute-reporter (GIE / llm-d-router): a number computed from the response's usage, returned to the
proxy as ext_proc dynamic metadata (e.g. `envoy.lb` `x-gateway-inference-request-cost`) with the last body chunk.

`attributes` holds exactly one `{key: {namespace (default envoy.lb), name}, expression, condition?}`: CEL over
`usage` (prompt_tokens, completion_tokens, total_tokens, prompt_tokens_details.cached_tokens), compiled at load
time. The expression must give an integer; the condition, when set, a boolean; a zero value is not reported.
"""

from __future__ import annotations

import logging
from typing import Any, Self

import celpy
import celpy.celtypes

from epp.framework import Endpoint, InferenceRequest, Params, Plugin, PluginContext, Usage
from epp.framework.attributes import RESPONSE_METADATA

log = logging.getLogger(__name__)
DEFAULT_NAMESPACE = "envoy.lb"


def _compile(env: celpy.Environment, params: Params, key: str) -> Any:
    text = params.str(key, "")
    try:
        return env.program(env.compile(text))
    except Exception as e:  # celpy raises its own parse errors
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise params.fail(key, f"invalid CEL expression ({why})") from None


def usage_value(usage: Usage | None) -> dict[str, Any]:
    u = usage or Usage()
    out: dict[str, Any] = {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.total_tokens,
    }
    if u.cached_tokens:
        out["prompt_tokens_details"] = {"cached_tokens": u.cached_tokens}
    return out


class RequestAttributeReporter(Plugin):
    type_name = "request-attribute-reporter"
    writes_response_metadata = True  # its value goes out with the last response body message

    def __init__(self, name: str, namespace: str, key: str, expression: Any, condition: Any | None) -> None:
        super().__init__(name)
        self.namespace, self.key = namespace, key
        self.expression, self.condition = expression, condition

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        attrs = params.list("attributes")
        if len(attrs) != 1:
            raise params.fail("attributes", "must contain exactly one entry")
        a = Params(name, attrs[0], path="attributes[0]")
        k = a.section("key")
        key_name = k.str("name", "")
        if not key_name:
            raise k.fail("name", "required")
        namespace = k.str("namespace", DEFAULT_NAMESPACE) or DEFAULT_NAMESPACE
        if not a.str("expression", "").strip():
            raise a.fail("expression", "required")
        env = celpy.Environment()
        expression = _compile(env, a, "expression")
        condition = _compile(env, a, "condition") if a.str("condition", "").strip() else None
        unknown = a.unread_error()
        if unknown is not None:
            raise unknown
        return cls(name, namespace, key_name, expression, condition)

    def value(self, usage: Usage | None) -> int | None:
        """The integer to report, or None (condition false, not an integer, zero, or an evaluation error)."""
        activation = {"usage": celpy.json_to_cel(usage_value(usage))}
        try:
            if self.condition is not None:
                ok = self.condition.evaluate(activation)
                if not isinstance(ok, celpy.celtypes.BoolType) or not bool(ok):
                    return None
            v = self.expression.evaluate(activation)
        except Exception as e:
            log.warning("%s: CEL evaluation failed: %s", self.name, e)
            return None
        if isinstance(v, celpy.celtypes.BoolType) or not isinstance(v, int):
            log.warning("%s: the expression gave %s, not an integer", self.name, type(v).__name__)
            return None
        return int(v) or None

    def response_complete(self, request: InferenceRequest, endpoint: Endpoint | None, usage: Usage | None) -> None:
        v = self.value(usage)
        if v is None:
            return
        md = request.data.get(RESPONSE_METADATA)
        if md is None:
            md = {}
            request.data.put(RESPONSE_METADATA, md)
        md.setdefault(self.namespace, {})[self.key] = float(v)
