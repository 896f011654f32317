"""Small HTTP helpers for the simulator tests (sync, stdlib only)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any


def post(url: str, body: Any, timeout: float = 30.0) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read().decode()
            status = r.status
    except urllib.error.HTTPError as e:
        raw = e.read().decode()
        status = e.code
    try:
        return status, json.loads(raw) if raw else None
    except json.JSONDecodeError:
        return status, raw


def get(url: str, timeout: float = 10.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def stream_ttft(url: str, body: dict[str, Any]) -> tuple[float, list[dict[str, Any]]]:
    """POST a streaming request; return (seconds to the first data chunk, all decoded chunks)."""
    req = urllib.request.Request(url, data=json.dumps({**body, "stream": True}).encode(),
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    t0 = time.perf_counter()
    ttft = None
    chunks: list[dict[str, Any]] = []
    with urllib.request.urlopen(req, timeout=30) as r:
        for line in r:
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            if ttft is None:
                ttft = time.perf_counter() - t0
            data = line[6:]
            if data == b"[DONE]":
                chunks.append({"done": True})
                break
            chunks.append(json.loads(data))
    assert ttft is not None
    return ttft, chunks
