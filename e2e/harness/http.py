"""A small blocking HTTP client for tests (http.client; no extra dependency), incl. reading SSE streams."""

from __future__ import annotations

import http.client
import json
import socket
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def request(
    url: str,
    method: str = "GET",
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 30.0,
) -> Response:
    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port or 80, timeout=timeout)
    try:
        conn.request(method, u.path or "/", body=body, headers=headers or {})
        r = conn.getresponse()
        data = r.read()
        return Response(r.status, {k.lower(): v for k, v in r.getheaders()}, data)
    finally:
        conn.close()


@dataclass
class WireResponse:
    """An HTTP/1.1 response as it came off the socket: `raw` is every byte after the header block (chunk framing
    included), `body` the decoded payload; `framing_ok` says the bytes agree with the framing headers."""

    status: int
    headers: dict[str, str]
    raw: bytes
    body: bytes
    framing_ok: bool
    framing_error: str

    def json(self) -> Any:
        return json.loads(self.body)


def _dechunk(raw: bytes) -> tuple[bytes, str]:
    """(payload, "" or why the chunked framing is broken)."""
    out, pos = bytearray(), 0
    while True:
        eol = raw.find(b"\r\n", pos)
        if eol < 0:
            return bytes(out), "chunked body ends without the last chunk"
        size = int(raw[pos:eol].split(b";", 1)[0], 16)
        pos = eol + 2
        if size == 0:
            rest = raw[pos:]
            return bytes(out), "" if rest.endswith(b"\r\n") else f"bad chunked trailer section {rest!r}"
        if len(raw) < pos + size + 2 or raw[pos + size : pos + size + 2] != b"\r\n":
            return bytes(out), f"chunk of {size} bytes at {pos} is truncated or not followed by CRLF"
        out += raw[pos : pos + size]
        pos += size + 2


def wire_request(
    url: str, method: str = "GET", body: bytes = b"", headers: dict[str, str] | None = None, timeout: float = 30.0
) -> WireResponse:
    """One request on a fresh connection with `connection: close`, read to EOF, so the response's framing
    (content-length vs. the bytes actually sent, or the chunked encoding) can be checked rather than trusted
    (http.client reads exactly content-length bytes and would hide a mismatch)."""
    u = urlsplit(url)
    hs = {"host": u.netloc, "content-length": str(len(body)), **(headers or {}), "connection": "close"}
    head = f"{method} {u.path or '/'} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in hs.items()) + "\r\n"
    data = bytearray()
    with socket.create_connection((u.hostname or "127.0.0.1", u.port or 80), timeout=timeout) as s:
        s.sendall(head.encode() + body)
        while chunk := s.recv(65536):
            data += chunk
    block, sep, raw = bytes(data).partition(b"\r\n\r\n")
    if not sep:
        raise AssertionError(f"no complete response header block: {bytes(data)[:300]!r}")
    lines = block.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    rh: dict[str, str] = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        rh[k.strip().lower()] = v.strip()
    error = ""
    if "chunked" in rh.get("transfer-encoding", ""):
        payload, error = _dechunk(raw)
        if "content-length" in rh:
            error = error or "both content-length and transfer-encoding: chunked"
    elif "content-length" in rh:
        payload = raw
        if int(rh["content-length"]) != len(raw):
            error = f"content-length {rh['content-length']} but {len(raw)} body bytes"
    else:
        payload = raw  # delimited by the connection close
    return WireResponse(status, rh, raw, payload, not error, error)


def post_json(url: str, obj: Any, headers: dict[str, str] | None = None, timeout: float = 30.0) -> Response:
    h = {"content-type": "application/json", **(headers or {})}
    return request(url, "POST", json.dumps(obj).encode(), h, timeout)


def post_json_lines(url: str, obj: Any, timeout: float = 30.0) -> tuple[int, list[tuple[float, bytes]]]:
    """POST and read the response line by line: (status, [(monotonic arrival time, line)]) — shows streaming."""
    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port or 80, timeout=timeout)
    try:
        conn.request("POST", u.path or "/", body=json.dumps(obj).encode(), headers={"content-type": "application/json"})
        r = conn.getresponse()
        lines = []
        while True:
            line = r.readline()
            if not line:
                break
            lines.append((time.monotonic(), line))
        return r.status, lines
    finally:
        conn.close()


def sse_events(body: bytes) -> list[Any]:
    """Decoded `data:` payloads of an SSE body ("[DONE]" kept as the string)."""
    out: list[Any] = []
    for line in body.split(b"\n"):
        if line.startswith(b"data: "):
            payload = line[6:].strip()
            out.append("[DONE]" if payload == b"[DONE]" else json.loads(payload))
    return out


def metric_value(text: str, name: str, labels: dict[str, str] | None = None, default: float | None = None) -> float:
    """Sum of a Prometheus sample's values across series whose labels include `labels` (KeyError if there is
    none, unless a `default` is given)."""
    total = 0.0
    found = False
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        metric, _, lbl = head.partition("{")
        if metric != name:
            continue
        got = dict(part.split("=", 1) for part in lbl.rstrip("}").split(",") if "=" in part)
        got = {k: v.strip('"') for k, v in got.items()}
        if all(got.get(k) == v for k, v in (labels or {}).items()):
            total += float(value)
            found = True
    if not found:
        if default is not None:
            return default
        raise KeyError(f"{name}{labels or ''} not in metrics")
    return total
