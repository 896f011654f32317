"""passthrough-parser: keeps the body and reads nothing."""

from __future__ import annotations

from tests.plugins.parsers.support import hdrs, parse_request


def test_passthrough_keeps_the_body_and_reads_nothing() -> None:
    body = b"\x00\xffnot json at all"
    req, fwd = parse_request(hdrs("/custom/api"), body, {"": "x"})
    assert fwd is body and (req.api, req.model, req.prompt, req.messages) == ("passthrough", "", None, None)
