"""vertexai-parser: chat completions and rawPredict."""

from __future__ import annotations

import pytest

from epp.framework.errors import BadRequest
from epp.plugins.parsers._grpc import grpc_frame
from epp.plugins.parsers.vertexai_parser import VertexAIParser
from tests.plugins.parsers.support import _grpc_headers


def test_vertexai_chat_completions_and_raw_predict() -> None:
    from google.api import httpbody_pb2

    def request(data: bytes) -> bytes:
        body = httpbody_pb2.HttpBody(content_type="application/json", data=data).SerializeToString()
        endpoint = b"projects/p/endpoints/e"
        # ChatCompletionsRequest{endpoint = 1; http_body = 2}
        msg = b"\x0a" + bytes([len(endpoint)]) + endpoint + b"\x12" + bytes([len(body)]) + body
        return grpc_frame(msg)

    parser = VertexAIParser()
    chat = b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'
    got = parser.parse(
        _grpc_headers("google.cloud.aiplatform.v1beta1.PredictionService/ChatCompletions"), request(chat)
    )
    assert (got.api, got.model, got.messages, got.rewrite_model) == (
        "chat",
        "m",
        [{"role": "user", "content": "hi"}],
        None,
    )
    raw = b'{"model":"m","input":"hello"}'
    got = parser.parse(_grpc_headers("google.cloud.aiplatform.v1.PredictionService/RawPredict"), request(raw))
    assert (got.api, got.messages) == ("responses", [{"role": "user", "content": "hello"}])
    with pytest.raises(BadRequest, match="parsing ChatCompletionsRequest: model not found"):
        parser.parse(_grpc_headers("x.PredictionService/ChatCompletions"), request(b'{"messages":[]}'))
    assert parser.parse(_grpc_headers("x.PredictionService/Predict"), b"").skip_response
