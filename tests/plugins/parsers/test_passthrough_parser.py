"""passthrough-parser: keeps the body and reads nothing."""

from __future__ import annotations

from collections.abc import Mapping

from epp.framework.parsing import request_path
from epp.framework.types import InferenceRequest
from epp.protocol.openai import build_request
from epp.wiring.builtins import default_parsers

DEFAULT = default_parsers()


def parse_request(
    headers: dict[str, str], body: bytes, rewrites: Mapping[str, str] | None = None
) -> tuple[InferenceRequest, bytes]:
    """What the server does with a body: the parser for the path, then the request assembly."""
    parsed = DEFAULT.resolve(request_path(headers)).parse(headers, body)
    return build_request(headers, parsed, body, rewrites)


def hdrs(path: str = "/v1/completions", **extra: str) -> dict[str, str]:
    return {":path": path, ":method": "POST", **extra}


def test_passthrough_keeps_the_body_and_reads_nothing() -> None:
    body = b"\x00\xffnot json at all"
    req, fwd = parse_request(hdrs("/custom/api"), body, {"": "x"})
    assert fwd is body and (req.api, req.model, req.prompt, req.messages) == ("passthrough", "", None, None)
