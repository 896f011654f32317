"""vllmgrpc-parser (llm-d `requestHandler.parsers`): vLLM's gRPC API (`vllm.grpc.engine.VllmEngine`) through Envoy.

The body is a gRPC-framed protobuf message. `Generate` with tokenized input is routed on its token ids (and the
multimodal hashes and placeholders it carries) without tokenization; text input is tokenized as a completion
prompt. `Embed` needs tokenized input. Other methods are routed without parsing and without reading the response,
as the router does. The body is forwarded unchanged; errors are gRPC statuses.
"""

from __future__ import annotations

from collections.abc import Mapping

from epp.framework import ApiKind, BadRequest
from epp.framework.parsing import ParsedRequest
from epp.framework.types import MultiModalFeature
from epp.plugins.parsers import _grpc as pw
from epp.plugins.parsers._common import ParserPlugin

GENERATE = "vllm.grpc.engine.VllmEngine/Generate"
EMBED = "vllm.grpc.engine.VllmEngine/Embed"

# vllm_engine.proto field numbers (smg-grpc-proto, as vLLM's gRPC server uses it).
_REQ_TOKENIZED, _REQ_TEXT, _REQ_SAMPLING, _REQ_STREAM, _REQ_MM = 2, 3, 4, 5, 7
_TOK_INPUT_IDS = 2
_SP_MAX_TOKENS = 8
_MM_PLACEHOLDERS, _MM_HASHES = 5, 6
_PH_OFFSET, _PH_LENGTH = 1, 2


def _token_ids(msg: bytes | None, what: str) -> list[int]:
    if msg is None:
        raise BadRequest(f"missing tokenized input in {what}")
    ids = pw.repeated_uint32(pw.fields(msg), _TOK_INPUT_IDS)
    if not ids:
        raise BadRequest(f"{what}: tokenized input has no input_ids")
    return ids


def _mm_features(msg: bytes | None) -> list[MultiModalFeature] | None:
    if msg is None:
        return None
    f = pw.fields(msg)
    placeholders = pw.repeated_messages(f, _MM_PLACEHOLDERS)
    hashes = pw.repeated_str(f, _MM_HASHES)
    out = []
    for i, ph in enumerate(placeholders):
        out.append(
            MultiModalFeature(
                modality="image",  # as the router: the gRPC API carries image inputs
                hash=hashes[i] if i < len(hashes) else "",
                offset=pw.last_int(ph, _PH_OFFSET) or 0,
                length=pw.last_int(ph, _PH_LENGTH) or 0,
            )
        )
    return out or None


class VLLMGRPCParser(ParserPlugin):
    type_name = "vllmgrpc-parser"
    paths = (GENERATE, EMBED)
    error_format = "grpc"

    def parse(self, headers: Mapping[str, str], body: bytes) -> ParsedRequest:
        path = headers.get(":path", "")
        if not (path.endswith(GENERATE) or path.endswith(EMBED)):
            return ParsedRequest(api=ApiKind.PASSTHROUGH, skip_response=True)
        f = pw.fields(pw.grpc_message(body))
        if path.endswith(EMBED):
            ids = _token_ids(pw.last_bytes(f, _REQ_TOKENIZED), "EmbedRequest")
            return ParsedRequest(api=ApiKind.EMBEDDINGS, token_ids=ids)
        out = ParsedRequest(api=ApiKind.GENERATE, stream=bool(pw.last_int(f, _REQ_STREAM)))
        tokenized = pw.last_bytes(f, _REQ_TOKENIZED)
        text = pw.last_bytes(f, _REQ_TEXT)
        if tokenized is not None:
            out.token_ids = _token_ids(tokenized, "GenerateRequest")
            out.mm_features = _mm_features(pw.last_bytes(f, _REQ_MM))
        elif text is not None:
            out.api = ApiKind.COMPLETIONS
            out.prompt = pw.last_str(f, _REQ_TEXT)
        else:
            raise BadRequest("GenerateRequest has no input (tokenized or text)")
        sampling = pw.last_bytes(f, _REQ_SAMPLING)
        if sampling is not None:
            out.max_tokens = pw.last_int(pw.fields(sampling), _SP_MAX_TOKENS)
        return out
