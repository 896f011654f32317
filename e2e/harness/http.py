"""A small blocking HTTP client for tests (http.client; no extra dependency), incl. reading SSE streams."""

from __future__ import annotations

import http.client
import json
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
