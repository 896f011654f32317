"""vertexai-parser (llm-d `requestHandler.parsers`): Vertex AI's PredictionService over gRPC.

`ChatCompletions`, `RawPredict` and `StreamRawPredict` carry an OpenAI JSON body in their `http_body`
(google.api.HttpBody); it is parsed as chat completions (ChatCompletions) or Responses (the raw predicts), as the
router does. Other methods are routed without parsing. The gRPC body is forwarded unchanged; errors are gRPC
statuses.
"""

from __future__ import annotations

from collections.abc import Mapping

from epp.framework import ApiKind, BadRequest
from epp.framework.parsing import ParsedRequest
from epp.plugins.parsers import _grpc as pw
from epp.plugins.parsers._common import ParserPlugin
from epp.plugins.parsers.openai_parser import parse_openai

CHAT_COMPLETIONS = "PredictionService/ChatCompletions"
STREAM_RAW_PREDICT = "PredictionService/StreamRawPredict"
RAW_PREDICT = "PredictionService/RawPredict"

_HTTP_BODY = 2  # ChatCompletionsRequest / RawPredictRequest / StreamRawPredictRequest.http_body
_HTTP_BODY_DATA = 2  # google.api.HttpBody.data


class VertexAIParser(ParserPlugin):
    type_name = "vertexai-parser"
    paths = (CHAT_COMPLETIONS, STREAM_RAW_PREDICT, RAW_PREDICT)
    error_format = "grpc"

    def parse(self, headers: Mapping[str, str], body: bytes) -> ParsedRequest:
        path = headers.get(":path", "")
        if path.endswith(CHAT_COMPLETIONS):
            method, api = "ChatCompletionsRequest", ApiKind.CHAT
        elif path.endswith(STREAM_RAW_PREDICT):
            method, api = "StreamRawPredictRequest", ApiKind.RESPONSES
        elif path.endswith(RAW_PREDICT):
            method, api = "RawPredictRequest", ApiKind.RESPONSES
        else:
            return ParsedRequest(api=ApiKind.PASSTHROUGH, skip_response=True)
        http_body = pw.last_bytes(pw.fields(pw.grpc_message(body)), _HTTP_BODY)
        if http_body is None:
            raise BadRequest(f"{method} has no HttpBody")
        data = pw.last_bytes(pw.fields(http_body), _HTTP_BODY_DATA) or b""
        try:
            out = parse_openai(api, data)
        except BadRequest as e:
            raise BadRequest(f"parsing {method}: {e.message}") from None
        out.rewrite_model = None  # the protobuf payload is forwarded as sent
        return out
