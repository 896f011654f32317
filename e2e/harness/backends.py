"""Tiny aiohttp model-server stand-ins that report what reached them (for routing tests, not for scheduling).

Each backend answers every path. The JSON reply carries `backend` (its name), `path`, `method`, `headers` it
received, `body_len`, `body_sha256`, and `received_model`, in an OpenAI-like shape with `usage`
(prompt_tokens=11, completion_tokens=max_tokens or 7, cached_tokens=3). With `"stream": true` it answers SSE:
`n` chunks (n = max_tokens or 3) each naming the model, then a usage chunk when
`stream_options.include_usage` is true, then `data: [DONE]`. `BackendPool` runs them on a background thread.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
from dataclasses import dataclass
from typing import Any

from aiohttp import web

PROMPT_TOKENS = 11
CACHED_TOKENS = 3
DEFAULT_COMPLETION_TOKENS = 7


@dataclass
class Backend:
    name: str
    host: str
    port: int

    @property
    def hostport(self) -> str:
        return f"{self.host}:{self.port}"


def _usage(completion: int) -> dict[str, Any]:
    return {
        "prompt_tokens": PROMPT_TOKENS,
        "completion_tokens": completion,
        "total_tokens": PROMPT_TOKENS + completion,
        "prompt_tokens_details": {"cached_tokens": CACHED_TOKENS},
    }


def make_app(name: str) -> web.Application:
    async def handle(request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        parsed: Any = None
        if raw:
            try:
                parsed = json.loads(raw)
            except ValueError:
                parsed = None
        body = parsed if isinstance(parsed, dict) else {}
        model = body.get("model")
        info = {
            "backend": name,
            "path": request.path,
            "method": request.method,
            "headers": {k.lower(): v for k, v in request.headers.items()},
            "body_len": len(raw),
            "body_sha256": hashlib.sha256(raw).hexdigest(),
            "received_model": model,  # not "model": that key is rewritten back on the way out
        }
        max_tokens = body.get("max_tokens")
        n = max_tokens if isinstance(max_tokens, int) and max_tokens > 0 else None
        if body.get("stream") is True:
            resp = web.StreamResponse(headers={"content-type": "text/event-stream", "x-backend": name})
            await resp.prepare(request)
            count = n or 3
            for i in range(count):
                chunk = {
                    "id": "cmpl-1",
                    "object": "chat.completion.chunk",
                    "model": model,
                    "backend": name,
                    "choices": [{"index": 0, "delta": {"content": f"tok{i} "}}],
                }
                await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                await asyncio.sleep(0.005)
            opts = body.get("stream_options")
            if isinstance(opts, dict) and opts.get("include_usage"):
                last: dict[str, Any] = {
                    "id": "cmpl-1",
                    "object": "chat.completion.chunk",
                    "model": model,
                    "choices": [],
                    "usage": _usage(count),
                }
                await resp.write(b"data: " + json.dumps(last).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        reply = {
            "id": "cmpl-1",
            "object": "chat.completion" if request.path.endswith("/chat/completions") else "text_completion",
            "model": model,
            "echo": info,
            "choices": [{"index": 0, "text": "hello", "finish_reason": "stop"}],
            "usage": _usage(n or DEFAULT_COMPLETION_TOKENS),
        }
        return web.json_response(reply, headers={"x-backend": name})

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


class BackendPool:
    """Runs backends on one background event-loop thread; `start(n)` returns them, `close()` stops all."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.backends: list[Backend] = []
        self._loop = asyncio.new_event_loop()
        self._runners: list[web.AppRunner] = []
        self._thread = threading.Thread(target=self._loop.run_forever, name="backends", daemon=True)
        self._thread.start()

    def start(self, n: int, prefix: str = "backend") -> list[Backend]:
        out = [self.add(f"{prefix}-{len(self.backends)}") for _ in range(n)]
        return out

    def add(self, name: str) -> Backend:
        port = asyncio.run_coroutine_threadsafe(self._serve(name), self._loop).result(timeout=10)
        b = Backend(name=name, host=self.host, port=port)
        self.backends.append(b)
        return b

    async def _serve(self, name: str) -> int:
        runner = web.AppRunner(make_app(name), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.host, 0)
        await site.start()
        self._runners.append(runner)
        return int(runner.addresses[0][1])

    def close(self) -> None:
        async def stop() -> None:
            for r in self._runners:
                await r.cleanup()

        if self._loop.is_running():
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(timeout=10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
        self._loop.close()
