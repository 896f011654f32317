"""The response model-name rewriter: split anywhere, holds back only possible prefixes, unicode names."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from epp.protocol.rewrite import ModelNameRewriter

REPLY = (
    b'{"id":"x","model":"served-model","choices":[{"text":"the \\"model\\": \\"served-model\\""}],'
    b'"m":{"model": "served-model"}}'
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(REPLY)), max_size=10))
def test_rewriter_split_anywhere(cuts: list[int]) -> None:
    points = sorted(set(cuts))
    parts = [REPLY[a:b] for a, b in zip([0, *points], [*points, len(REPLY)], strict=True)]
    rw = ModelNameRewriter("served-model", "client")
    out = b"".join(rw.feed(p, i == len(parts) - 1) for i, p in enumerate(parts))
    assert out == REPLY.replace(b'"model":"served-model"', b'"model":"client"').replace(
        b'"model": "served-model"', b'"model": "client"'
    )
    assert json.loads(out)["model"] == "client"


def test_rewriter_holds_back_only_possible_prefixes() -> None:
    rw = ModelNameRewriter("t", "client")
    assert rw.feed(b'data: {"a":1}\n\n') == b'data: {"a":1}\n\n'
    assert rw.feed(b'{"x":1,"mod') == b'{"x":1,'
    assert rw.feed(b'el":"t"}', True) == b'"model":"client"}'


def test_rewriter_unicode_names() -> None:
    rw = ModelNameRewriter("modèle-服务", "client-é")
    body = json.dumps({"model": "modèle-服务"}, ensure_ascii=False).encode()
    assert json.loads(rw.feed(body, True)) == {"model": "client-é"}
