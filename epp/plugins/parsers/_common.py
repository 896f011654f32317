"""What the JSON parsers share: body decoding, field readers, the model rewrite and the parser base class."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import msgspec

from epp.framework import BadRequest, Plugin
from epp.framework.parsing import LARGE_BODY_BYTES, ParsedRequest

# Deeper JSON is refused with 400: no API body nests this deep, and every walk over the body (templates,
# re-encoding, plugins) would otherwise pay for it (or hit Python's recursion limit).
MAX_JSON_DEPTH = 128

_fast_decode = msgspec.json.Decoder().decode
_fast_encode = msgspec.json.Encoder().encode


class _NonFiniteJSON(dict[str, Any]):
    """A decoded body holding NaN/Infinity (which only the stdlib parser accepts): re-encoded by the stdlib too,
    which writes them back as they came (msgspec would write `null`)."""


def _nonfinite(seen: list[bool]) -> tuple[Callable[[str], float], Callable[[str], float]]:
    def constant(text: str) -> float:
        seen.append(True)
        return float(text)

    def number(text: str) -> float:
        value = float(text)
        if value in (_INF, -_INF):  # 1e400
            seen.append(True)
        return value

    return constant, number


_INF = float("inf")


def decode_json_object(body: bytes, max_depth: int = MAX_JSON_DEPTH) -> dict[str, Any]:
    """The body's JSON object. msgspec decodes straight from the bytes (the stdlib first makes a `str` copy of the
    whole body: one more body-sized buffer alive while parsing); what msgspec refuses (lone surrogate escapes,
    NaN, numbers out of float range, malformed JSON) goes through the stdlib, which decides and words the error."""
    if not body:
        raise BadRequest("request body is empty")
    try:
        parsed = _fast_decode(body)
    except Exception:  # whatever msgspec refuses, the stdlib judges
        parsed = _stdlib_decode(body, max_depth)
    if not isinstance(parsed, dict):
        raise BadRequest("request body must be a JSON object")
    if _containers(body, max_depth) > max_depth:  # only then can it nest that deep (a C-speed check)
        _check_depth(parsed, max_depth)
    return parsed


_COUNT_STEP = 1 << 20


def _containers(body: bytes, limit: int) -> int:
    """How many `{` and `[` the body holds (counting stops past `limit`). A large body (parsed on the parse thread)
    is counted a MiB at a time: one `count` over 100 MiB holds the GIL, and so the event loop, for ~50 ms."""
    if len(body) < LARGE_BODY_BYTES:
        # find() is memchr: a body with few containers (the usual request) is scanned at memory speed, where each
        # count() walked it byte by byte (5 us for two counts over a 7 KB completion, the JSON decode itself 1.4)
        n = 0
        for ch in b"{[":
            i = body.find(ch)
            while i >= 0:
                n += 1
                if n > limit:
                    return n
                i = body.find(ch, i + 1)
        return n
    n = 0
    for i in range(0, len(body), _COUNT_STEP):
        n += body.count(b"{", i, i + _COUNT_STEP) + body.count(b"[", i, i + _COUNT_STEP)
        if n > limit:
            break
    return n


def _stdlib_decode(body: bytes, max_depth: int) -> Any:
    seen: list[bool] = []
    constant, number = _nonfinite(seen)
    try:
        parsed = json.loads(body, parse_constant=constant, parse_float=number)
    except UnicodeDecodeError:
        raise BadRequest("request body is not valid UTF-8") from None
    except ValueError as e:
        raise BadRequest(f"request body is not valid JSON: {e}") from None
    except RecursionError:
        raise BadRequest(f"request body nests deeper than {max_depth} levels") from None
    if seen and isinstance(parsed, dict):
        return _NonFiniteJSON(parsed)
    return parsed


def _check_depth(root: dict[str, Any], max_depth: int) -> None:
    """Iterative (no recursion), a level at a time: the decoded body's containers nest at most `max_depth` deep.
    Only containers are visited further, tested by exact type (decoded JSON has no subclasses below the root): a
    stack of (node, depth) pairs with isinstance on every value costs more than the decode itself on a body of
    many small objects."""
    level: list[Any] = [root]
    depth = 1
    while level:
        if depth > max_depth:
            raise BadRequest(f"request body nests deeper than {max_depth} levels")
        deeper: list[Any] = []
        add = deeper.append
        for node in level:
            for v in node.values() if isinstance(node, dict) else node:
                t = type(v)
                if t is dict or t is list:
                    add(v)
        level = deeper
        depth += 1


def encode_json_body(parsed: dict[str, Any], nonfinite: bool = False) -> bytes:
    """Compact UTF-8 JSON; strings holding lone surrogates (from `\\ud800` escapes) are kept as escapes. msgspec
    encodes straight to bytes (the stdlib builds a `str` of the whole body first); the stdlib takes what msgspec
    cannot write as it came (lone surrogates, NaN/Infinity)."""
    if not nonfinite:
        try:
            return _fast_encode(parsed)
        except (UnicodeEncodeError, TypeError, OverflowError):
            pass
    try:
        return json.dumps(parsed, ensure_ascii=False, separators=(",", ":")).encode()
    except UnicodeEncodeError:
        return json.dumps(parsed, ensure_ascii=True, separators=(",", ":")).encode()


def json_model_rewriter(parsed: dict[str, Any]) -> Callable[[str], bytes]:
    """The body re-encoded with `model` replaced (only called when the target model differs)."""

    nonfinite = isinstance(parsed, _NonFiniteJSON)

    def rewrite(model: str) -> bytes:
        out = dict(parsed)
        out["model"] = model
        return encode_json_body(out, nonfinite)

    return rewrite


def non_negative_int(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def first_int(body: Mapping[str, Any], *keys: str) -> int | None:
    for key in keys:
        v = non_negative_int(body.get(key))
        if v is not None:
            return v
    return None


def required_model(body: Mapping[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("model not found in request body")
    return model


def optional_model(body: Mapping[str, Any]) -> str:
    model = body.get("model")
    if model is None:
        return ""
    if not isinstance(model, str):
        raise BadRequest("model must be a string")
    return model


def token_id_list(value: Any, field: str) -> list[int]:
    """A non-empty list of token ids (uint32, as the router accepts them)."""
    if not isinstance(value, list) or not value:
        raise BadRequest(f"{field} must be a non-empty array of token ids")
    for i, t in enumerate(value):
        if type(t) is not int or not 0 <= t <= 0xFFFFFFFF:
            raise BadRequest(f"{field}[{i}]: invalid token id {str(t)[:40]}")
    return value


def check_token_ids(value: Any, field: str) -> None:
    """A prompt given as token ids (a list of ints, or a list of such lists) must hold uint32 ids: vLLM answers
    others with a 400, and the prefix hash cannot pack them (`OverflowError` on `2**70` or `-1`)."""
    if not isinstance(value, list) or not value:
        return
    try:  # the usual list of ids at C speed
        if min(value) >= 0 and max(value) <= 0xFFFFFFFF:
            return
    except TypeError:  # strings, nested lists or mixed items: item by item
        pass
    for i, t in enumerate(value):
        if type(t) is int:
            if not 0 <= t <= 0xFFFFFFFF:
                raise BadRequest(f"{field}[{i}]: invalid token id {str(t)[:40]}")
        elif isinstance(t, list):
            for j, u in enumerate(t):
                if type(u) is int and not 0 <= u <= 0xFFFFFFFF:
                    raise BadRequest(f"{field}[{i}][{j}]: invalid token id {str(u)[:40]}")


def cache_salt(body: Mapping[str, Any], key: str = "cache_salt") -> str | None:
    salt = body.get(key)
    if salt is None:
        return None
    if not isinstance(salt, str):
        raise BadRequest(f"{key} must be a string")
    return salt or None


class ParserPlugin(Plugin):
    """Base of the request parsers: the paths it claims and the shape of its errors."""

    paths: ClassVar[tuple[str, ...]] = ()
    error_format: str = "openai"

    def claims(self) -> Sequence[str]:
        return self.paths

    def parse(self, headers: Mapping[str, str], body: bytes) -> ParsedRequest:
        raise NotImplementedError
