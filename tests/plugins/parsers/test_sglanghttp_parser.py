"""sglanghttp-parser: /generate with ids, batches, text and the cache salt."""

from __future__ import annotations

import pytest

from epp.framework.errors import BadRequest
from epp.framework.parsing import ParserRegistry
from epp.plugins.parsers.openai_parser import OpenAIParser
from epp.plugins.parsers.sglanghttp_parser import SGLangHTTPParser
from tests.plugins.parsers.support import hdrs


def test_sglang_generate_ids_batch_text_and_salt() -> None:
    reg = ParserRegistry([SGLangHTTPParser(), OpenAIParser()])
    p = reg.resolve("/generate")
    got = p.parse(
        hdrs("/generate"), b'{"input_ids":[[5,6],[7]],"extra_key":"k","sampling_params":{"max_new_tokens":3}}'
    )
    assert (got.token_ids, got.cache_salt, got.max_tokens) == ([5, 6], "k", 3)
    got = p.parse(hdrs("/generate"), b'{"text":"hello","stream":true}')
    assert (got.api, got.prompt, got.token_ids, got.stream) == ("completions", "hello", None, True)
    for bad, fragment in [(b"{}", "input_ids or text"), (b'{"input_ids":"x"}', "input_ids"),
                          (b'{"input_ids":[1],"extra_key":3}', "extra_key")]:  # fmt: skip
        with pytest.raises(BadRequest, match=fragment):
            p.parse(hdrs("/generate"), bad)
    with pytest.raises(BadRequest, match="unsupported path"):
        p.parse(hdrs("/v2/generate"), b'{"input_ids":[1]}')
