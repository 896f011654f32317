"""vllmhttp-parser (llm-d `requestHandler.parsers`): vLLM's `/inference/v1/generate` (tokens in, tokens out).

The prompt is `token_ids`, so it is routed on them directly: no tokenization. `features` carries the multimodal
items (`mm_hashes` and `mm_placeholders` per modality), which go into the block keys as the engine's do.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from epp.framework import ApiKind, BadRequest
from epp.framework.parsing import ParsedRequest, match_path_suffix, request_path
from epp.framework.types import MultiModalFeature
from epp.plugins.parsers._common import (
    ParserPlugin,
    cache_salt,
    decode_json_object,
    first_int,
    json_model_rewriter,
    non_negative_int,
    optional_model,
    token_id_list,
)

GENERATE = "inference/v1/generate"


def generate_features(features: Any) -> list[MultiModalFeature] | None:
    """`features: {mm_hashes: {modality: [hash]}, mm_placeholders: {modality: [{offset, length}]}}`."""
    if features is None:
        return None
    if not isinstance(features, dict):
        raise BadRequest("features must be an object")
    hashes = features.get("mm_hashes") or {}
    places = features.get("mm_placeholders") or {}
    if not isinstance(hashes, dict) or not isinstance(places, dict):
        raise BadRequest("features.mm_hashes and features.mm_placeholders must be objects")
    out: list[MultiModalFeature] = []
    for modality, hs in hashes.items():
        ps = places.get(modality) or []
        if not isinstance(hs, list) or not isinstance(ps, list):
            raise BadRequest(f"features: {str(modality)[:40]} must map to arrays")
        for i, h in enumerate(hs):
            if not isinstance(h, str):
                raise BadRequest(f"features.mm_hashes.{str(modality)[:40]}[{i}] must be a string")
            ph = ps[i] if i < len(ps) else {}
            if not isinstance(ph, dict):
                raise BadRequest(f"features.mm_placeholders.{str(modality)[:40]}[{i}] must be an object")
            offset, length = non_negative_int(ph.get("offset", 0)), non_negative_int(ph.get("length", 0))
            if offset is None or length is None:
                raise BadRequest(f"features.mm_placeholders.{str(modality)[:40]}[{i}]: invalid offset or length")
            out.append(MultiModalFeature(str(modality), h, offset, length))
    out.sort(key=lambda f: f.offset)
    return out or None


class VLLMHTTPParser(ParserPlugin):
    type_name = "vllmhttp-parser"
    paths = (GENERATE,)

    def parse(self, headers: Mapping[str, str], body: bytes) -> ParsedRequest:
        path = request_path(headers)
        if not match_path_suffix(path, GENERATE):
            raise BadRequest(f"unsupported path: {path[:200]}")
        parsed = decode_json_object(body)
        sampling = parsed.get("sampling_params")
        if sampling is not None and not isinstance(sampling, dict):
            raise BadRequest("sampling_params must be an object")
        return ParsedRequest(
            api=ApiKind.GENERATE,
            model=optional_model(parsed),
            body=parsed,
            token_ids=token_id_list(parsed.get("token_ids"), "token_ids"),
            mm_features=generate_features(parsed.get("features")),
            cache_salt=cache_salt(parsed),
            stream=parsed.get("stream") is True,
            max_tokens=first_int(sampling or {}, "max_tokens"),
            rewrite_model=json_model_rewriter(parsed) if "model" in parsed else None,
        )
