"""vllmgrpc-parser: Generate (tokenized and text), Embed and the other methods."""

from __future__ import annotations

import pytest

from epp.framework.errors import BadRequest
from epp.plugins.parsers._grpc import grpc_frame
from epp.plugins.parsers.vllmgrpc_parser import EMBED, GENERATE, VLLMGRPCParser
from tests.plugins.parsers.support import _grpc_headers


def test_vllmgrpc_generate_tokenized_text_embed_and_other_methods() -> None:
    from smg_grpc_proto import vllm_engine_pb2 as pb  # vLLM's own gRPC messages

    parser = VLLMGRPCParser()
    msg = pb.GenerateRequest(request_id="r", tokenized=pb.TokenizedInput(input_ids=[9, 8, 7]), stream=True)
    msg.sampling_params.max_tokens = 11
    msg.mm_inputs.mm_hashes.append("img0")
    msg.mm_inputs.mm_placeholders.append(pb.PlaceholderRange(offset=1, length=2))
    got = parser.parse(_grpc_headers(GENERATE), grpc_frame(msg.SerializeToString()))
    assert (got.api, got.token_ids, got.stream, got.max_tokens) == ("generate", [9, 8, 7], True, 11)
    assert [(f.modality, f.hash, f.offset, f.length) for f in got.mm_features or []] == [("image", "img0", 1, 2)]
    text = pb.GenerateRequest(text="hello there")
    got = parser.parse(_grpc_headers(GENERATE), grpc_frame(text.SerializeToString()))
    assert (got.api, got.prompt) == ("completions", "hello there")
    embed = pb.EmbedRequest(tokenized=pb.TokenizedInput(input_ids=[1, 2]))
    assert parser.parse(_grpc_headers(EMBED), grpc_frame(embed.SerializeToString())).token_ids == [1, 2]
    other = parser.parse(_grpc_headers("vllm.grpc.engine.VllmEngine/HealthCheck"), b"\x00\x00\x00\x00\x00")
    assert other.skip_response and other.api == "passthrough"
    for body, fragment in [
        (b"\x00\x00", "at least 5 bytes"),
        (b"\x01\x00\x00\x00\x01x", "compressed"),
        (b"\x00\x00\x00\x00\x09abc", "incomplete"),
        (grpc_frame(pb.GenerateRequest(request_id="r").SerializeToString()), "no input"),
        (grpc_frame(b"\x12\x05\x10"), "truncated"),
    ]:
        with pytest.raises(BadRequest, match=fragment):
            parser.parse(_grpc_headers(GENERATE), body)
