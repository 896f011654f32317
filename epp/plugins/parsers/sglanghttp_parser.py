"""sglanghttp-parser (llm-d `requestHandler.parsers`): SGLang's native `/generate`.

`input_ids` (one prompt or a batch; a batch is routed on its first prompt) needs no tokenization; `text` is
tokenized as a completion prompt. `extra_key` salts the prefix cache (SGLang's cache salt). The body is forwarded
unchanged (there is no model field).
"""

from __future__ import annotations

from collections.abc import Mapping

from epp.framework import ApiKind, BadRequest
from epp.framework.parsing import ParsedRequest, request_path
from epp.plugins.parsers._common import ParserPlugin, cache_salt, decode_json_object, first_int, token_id_list


class SGLangHTTPParser(ParserPlugin):
    type_name = "sglanghttp-parser"
    paths = ("generate",)

    def parse(self, headers: Mapping[str, str], body: bytes) -> ParsedRequest:
        path = request_path(headers).strip().rstrip("/")
        if path not in ("generate", "/generate"):
            raise BadRequest(f"unsupported path: {path[:200]}")
        parsed = decode_json_object(body)
        sampling = parsed.get("sampling_params")
        if isinstance(sampling, list):
            sampling = sampling[0] if sampling else None
        if sampling is not None and not isinstance(sampling, dict):
            raise BadRequest("sampling_params must be an object")
        out = ParsedRequest(
            api=ApiKind.GENERATE,
            body=parsed,
            cache_salt=cache_salt(parsed, "extra_key"),
            stream=parsed.get("stream") is True,
            max_tokens=first_int(sampling or {}, "max_new_tokens"),
        )
        ids = parsed.get("input_ids")
        text = parsed.get("text")
        if ids is not None:
            if isinstance(ids, list) and ids and isinstance(ids[0], list):
                for i, prompt in enumerate(ids):
                    token_id_list(prompt, f"input_ids[{i}]")
                ids = ids[0]
            out.token_ids = token_id_list(ids, "input_ids")
        elif text is not None:
            if isinstance(text, list) and text and all(isinstance(t, str) for t in text):
                text = text[0]
            if not isinstance(text, str) or not text:
                raise BadRequest("text must be a non-empty string or array of strings")
            out.api = ApiKind.COMPLETIONS
            out.prompt = text
        else:
            raise BadRequest("invalid generate request: input_ids or text must be provided")
        return out
