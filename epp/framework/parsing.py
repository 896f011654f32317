"""Request parsers (llm-d's `requestHandler.parsers`): the interface, what a parser returns, and the registry that
picks a parser for a request path as the router does (longest claimed path suffix wins; a parser that claims no
paths is the fallback, and registration stops there).

A parser turns a request body into a `ParsedRequest`: which API it is, the model, and what prefix-aware routing
needs (chat messages and tools as the model server will render them, a prompt, or token ids that need no
tokenization). Errors are `BadRequest`s; the server answers them in the parser's `error_format`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

from epp.framework.types import ApiKind, MultiModalFeature

log = logging.getLogger(__name__)

DEFAULT_PATH = "/v1/completions"  # the router's default when no path header is present

# Error shapes: "openai" (vLLM/OpenAI JSON), "anthropic" ({"type":"error","error":{...}}), "grpc" (grpc-status).
ERROR_FORMATS = ("openai", "anthropic", "grpc")

# A request body at least this large is parsed on a worker thread, not on the event loop (the JSON parsers count its
# `{`/`[` a MiB at a time there). The decode itself is one msgspec call that holds the GIL throughout, so the loop
# still waits for that decode and the bytes copy (docs/benchmarks.md: "A large request body's parse off the loop").
LARGE_BODY_BYTES = 4 * 1024 * 1024


def request_path(headers: Mapping[str, str]) -> str:
    """The API path: `:path`, then `x-original-path`, then `x-forwarded-path` (query string dropped)."""
    for key in (":path", "x-original-path", "x-forwarded-path"):
        value = headers.get(key)
        if value:
            return value.split("?", 1)[0]
    return DEFAULT_PATH


def content_length(value: str | bytes) -> int:
    """A Content-Length value, strictly: 1*DIGIT in ASCII (RFC 9110), surrounding spaces and tabs allowed; raises
    ValueError for anything else (str.isdigit() and int() take '²', Arabic-Indic or full-width digits, signs,
    underscores). More than 18 digits reads as 10**18, over any limit (int() of thousands of digits is refused)."""
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    digits = text.strip(" \t")
    if not digits or not digits.isascii() or not digits.isdigit():
        raise ValueError(f"invalid content-length {text[:40]!r}")
    return int(digits) if len(digits) <= 18 else 10**18


def match_path_suffix(path: str, suffix: str) -> bool:
    """The router's MatchPathSuffix: the path (trailing slash dropped) ends with the suffix (slashes trimmed)."""
    return path.strip().rstrip("/").endswith(suffix.strip().strip("/"))


@dataclass(slots=True)
class ParsedRequest:
    """What a parser read from one request body."""

    api: ApiKind
    model: str = ""
    body: dict[str, Any] = field(default_factory=dict)  # the decoded JSON object ({} for opaque payloads)
    prompt: str | list[Any] | None = None
    # Chat messages and tools in OpenAI chat form, as the model server renders them (Anthropic Messages and
    # Responses requests are converted the way vLLM converts them).
    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    token_ids: list[int] | None = None  # pre-tokenized input: routed without tokenization
    mm_features: list[MultiModalFeature] | None = None  # multimodal items of pre-tokenized input
    cache_salt: str | None = None
    stream: bool = False
    max_tokens: int | None = None
    # Returns the body to forward with the model replaced; None when the payload carries no model to rewrite.
    rewrite_model: Callable[[str], bytes] | None = None
    skip_response: bool = False  # the router's SkipResponseProcessing: route, but do not read the response


@runtime_checkable
class RequestParser(Protocol):
    """A `requestHandler.parsers` plugin."""

    name: str
    type_name: ClassVar[str]
    error_format: str

    def claims(self) -> Sequence[str]:
        """Path suffixes this parser handles (e.g. "chat/completions"); empty = the fallback for any path."""
        ...

    def parse(self, headers: Mapping[str, str], body: bytes) -> ParsedRequest:
        """Parse one request body (raises BadRequest)."""
        ...


class NoParser(Exception):
    """No configured parser claims the path."""


class ParserRegistry:
    """The router's ParserRegistry: longest matching suffix wins; the first parser with no claims is the fallback
    and any parser after it is skipped (logged); a second parser of an already registered type is skipped."""

    def __init__(self, parsers: Sequence[RequestParser]) -> None:
        self.entries: list[tuple[RequestParser, tuple[str, ...]]] = []
        self.fallback: RequestParser | None = None
        self.parsers: list[RequestParser] = []
        self.skipped: list[str] = []
        self._resolved: dict[str, RequestParser] = {}
        seen: set[str] = set()
        for i, parser in enumerate(parsers):
            duplicate = parser.type_name in seen
            if duplicate:
                log.warning("parser %s: type %s is already registered, skipped", parser.name, parser.type_name)
            else:
                seen.add(parser.type_name)
                self.parsers.append(parser)
            paths = tuple(p.strip().strip("/") for p in parser.claims())
            if not paths:
                self.fallback = parser
                for later in parsers[i + 1 :]:
                    log.warning(
                        "parser %s is configured after the fallback parser %s: skipped", later.name, parser.name
                    )
                    self.skipped.append(later.name)
                break
            if duplicate:
                self.skipped.append(parser.name)
            else:
                self.entries.append((parser, paths))

    _CACHE_MAX = 256  # paths come from clients: the memo is bounded (cleared when full)

    def resolve(self, path: str) -> RequestParser:
        """The parser for `path`; memoized per path (every request resolves one, and most share a few paths)."""
        cache = self._resolved
        parser = cache.get(path)
        if parser is None:
            parser = self._resolve(path)
            if len(cache) >= self._CACHE_MAX:
                cache.clear()
            cache[path] = parser
        return parser

    def _resolve(self, path: str) -> RequestParser:
        best: RequestParser | None = None
        best_len = 0
        for parser, suffixes in self.entries:
            for suffix in suffixes:
                if len(suffix) > best_len and match_path_suffix(path, suffix):
                    best, best_len = parser, len(suffix)
        if best is not None:
            return best
        if self.fallback is not None:
            return self.fallback
        raise NoParser(f"no parser registered matching path suffix for: {path}")
