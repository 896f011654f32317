"""Helpers shared by the parser tests."""

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


def _grpc_headers(method: str) -> dict[str, str]:
    return {":path": f"/{method}", ":method": "POST", "content-type": "application/grpc"}
