"""Request errors that end a request with an HTTP status and an OpenAI-style JSON body."""

from __future__ import annotations

import json


class RequestError(Exception):
    """A request-level failure that the proxy must answer with `status` (never a crashed stream)."""

    status: int = 500
    code: str = "Internal"

    def __init__(
        self, message: str, *, status: int | None = None, code: str | None = None, dropped_reason: str | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        # The router's typed reason for a request dropped before (or evicted after) dispatch, sent to the client
        # as `x-llm-d-request-dropped-reason` (one of the DROPPED_* values).
        self.dropped_reason = dropped_reason
        if status is not None:
            self.status = status
        if code is not None:
            self.code = code

    def body(self, error_format: str = "openai") -> bytes:
        """The JSON error body in the API's shape: OpenAI's (and vLLM's) by default, Anthropic's for the Messages
        API (`{"type": "error", "error": {"type": <Anthropic's type for the status>, "message": ...}}`)."""
        if error_format == "anthropic":
            return json.dumps(
                {"type": "error", "error": {"type": anthropic_error_type(self.status), "message": self.message}}
            ).encode()
        return json.dumps(
            {
                "error": {
                    "message": f"inference error: {self.code} - {self.message}",
                    "type": self.code,
                    "code": self.status,
                }
            }
        ).encode()


DROPPED_REASON_HEADER = "x-llm-d-request-dropped-reason"
# The router's RequestDroppedReason values (pkg/common/error/error.go).
DROPPED_SATURATED = "rejected-saturated"
DROPPED_NO_ENDPOINTS = "rejected-no-endpoints"
DROPPED_TTL_EXPIRED = "rejected-ttl-expired"
DROPPED_CONTEXT_CANCELLED = "rejected-context-cancelled"
DROPPED_SHUTTING_DOWN = "rejected-shutting-down"
DROPPED_EVICTED = "evicted"

# Anthropic's error.type per HTTP status (as vLLM's /v1/messages answers: translate_error_type).
_ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def anthropic_error_type(status: int) -> str:
    return _ANTHROPIC_ERROR_TYPES.get(status) or ("api_error" if status >= 500 else "invalid_request_error")


class BadRequest(RequestError):
    status = 400
    code = "BadRequest"


class ServiceUnavailable(RequestError):
    status = 503
    code = "ServiceUnavailable"


class TooManyRequests(RequestError):
    status = 429
    code = "ResourceExhausted"


class InternalError(RequestError):
    status = 500
    code = "Internal"


class TokenizationError(Exception):
    """The prompt could not be tokenized (unknown model, bad messages, tokenizer server error)."""
