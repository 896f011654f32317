"""The parsers' shared JSON decoding and model rewriting (`_common`): the stdlib's results and errors, NaN and
lone surrogates kept, the depth limit exact."""

from __future__ import annotations

import json
import math

import pytest

from epp.framework import BadRequest
from epp.plugins.parsers._common import decode_json_object, json_model_rewriter


@pytest.mark.parametrize(
    "body",
    [
        b'{"model":"m","a":[1,2.5,-0,1e16,12345678901234567890123],"b":{"c":null,"d":true},"e":"\\u00e9\\n\xc3\xa9"}',
        b'{"a":1,"a":2}',
        b' {"model" : "m" } ',
        b'{"s":"\\ud83d\\ude00 \\ud800 lone"}',  # msgspec refuses the lone surrogate: the stdlib decodes it
        b'{"x":NaN,"y":-Infinity,"z":1e400}',
    ],
)
def test_decoding_matches_the_stdlib(body: bytes) -> None:
    got = decode_json_object(body)
    want = json.loads(body)
    assert json.dumps(got, sort_keys=True) == json.dumps(want, sort_keys=True)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"a":1} x', "request body is not valid JSON: Extra data: line 1 column 9 (char 8)"),
        (b'{"a":"\xff"}', "request body is not valid UTF-8"),
        (b"[1]", "request body must be a JSON object"),
        (b"[" * 5000 + b"]" * 5000, "request body nests deeper than 128 levels"),
        (b'{"a":' + b"[" * 500 + b"]" * 500 + b"}", "request body nests deeper than 128 levels"),
    ],
)
def test_decoding_errors_are_the_stdlibs(body: bytes, message: str) -> None:
    with pytest.raises(BadRequest) as e:
        decode_json_object(body)
    assert e.value.message == message


def test_rewrite_keeps_nonfinite_numbers_and_lone_surrogates() -> None:
    """Re-encoding after a model rewrite writes NaN/Infinity and lone surrogates back as they came (msgspec would
    write NaN as null and cannot encode a lone surrogate)."""
    parsed = decode_json_object(b'{"model":"a","t":NaN,"u":Infinity,"v":1.5}')
    out = json_model_rewriter(parsed)("b")
    assert out == b'{"model":"b","t":NaN,"u":Infinity,"v":1.5}'
    back = json.loads(out)
    assert math.isnan(back["t"])
    parsed = decode_json_object(b'{"model":"a","s":"\\ud800x\xc3\xa9"}')
    assert json_model_rewriter(parsed)("b") == b'{"model":"b","s":"\\ud800x\\u00e9"}'
    parsed = decode_json_object(b'{"model":"a","s":"\xc3\xa9","n":12345678901234567890123}')
    assert json_model_rewriter(parsed)("b") == b'{"model":"b","s":"\xc3\xa9","n":12345678901234567890123}'


@pytest.mark.parametrize("nan", [False, True])
def test_depth_limit_is_exact(nan: bool) -> None:
    """128 levels pass and 129 do not, in lists and objects mixed, also under a root the stdlib decoded (NaN)."""
    extra = b',"n":NaN' if nan else b""

    def body(levels: int) -> bytes:  # the root object is level 1
        inner = b"1"
        for i in range(levels - 1):
            inner = b'{"k":' + inner + b"}" if i % 2 else b"[0," + inner + b"]"
        return b'{"model":"m","x":' + inner + extra + b"}"

    assert decode_json_object(body(128))["model"] == "m"
    with pytest.raises(BadRequest, match="nests deeper than 128 levels"):
        decode_json_object(body(129))
