"""vllmhttp-parser: /generate with token ids and multimodal features."""

from __future__ import annotations

import json
import re

import pytest

from epp.framework.errors import BadRequest
from tests.plugins.parsers.support import hdrs, parse_request


def test_vllm_generate_token_ids_and_features() -> None:
    body = {
        "token_ids": [1, 2, 3, 4],
        "features": {
            "mm_hashes": {"image": ["h1", "h0"]},
            "mm_placeholders": {"image": [{"offset": 3, "length": 1}, {"offset": 1, "length": 2}]},
        },
        "sampling_params": {"max_tokens": 5},
        "cache_salt": "s",
    }
    req, fwd = parse_request(hdrs("/inference/v1/generate"), json.dumps(body).encode(), {"": "x"})
    assert (req.api, req.token_ids, req.max_tokens, req.cache_salt, req.model) == ("generate", [1, 2, 3, 4], 5, "s", "")
    assert [(f.hash, f.offset, f.length) for f in req.mm_features or []] == [("h0", 1, 2), ("h1", 3, 1)]
    assert fwd == json.dumps(body).encode()  # no model field: nothing to rewrite
    for bad, fragment in [
        ({"token_ids": []}, "non-empty"),
        ({"token_ids": [1, -1]}, "token_ids[1]"),
        ({"token_ids": [1.5]}, "token_ids[0]"),
        ({"token_ids": [1], "features": {"mm_hashes": {"image": [1]}}}, "must be a string"),
    ]:
        with pytest.raises(BadRequest, match=re.escape(fragment)):
            parse_request(hdrs("/inference/v1/generate"), json.dumps(bad).encode())
