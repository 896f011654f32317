"""Request errors that end a request with an HTTP status and an OpenAI-style JSON body."""

from __future__ import annotations

import json


class RequestError(Exception):
    """A request-level failure that the proxy must answer with `status` (never a crashed stream)."""

    status: int = 500
    code: str = "Internal"

    def __init__(self, message: str, *, status: int | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        if code is not None:
            self.code = code

    def body(self) -> bytes:
        """The JSON error body, shaped like OpenAI's (and vLLM's) error responses."""
        return json.dumps(
            {
                "error": {
                    "message": f"inference error: {self.code} - {self.message}",
                    "type": self.code,
                    "code": self.status,
                }
            }
        ).encode()


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
