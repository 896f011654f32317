"""The sidecar's HTTP proxy (aiohttp): P/D orchestration for chat/completions, pass-through for everything else.

Prefill failures (unreachable, timeout, 5xx after `--prefill-max-retries`, a body that is not JSON, no
`kv_transfer_params` with nixlv2) fall back to a local prefill: the request goes to the local engine unchanged,
with a warning and `pd_sidecar_prefill_fallbacks_total{reason}`. A malformed prefiller header is a 400, a host the
allowlist refuses a 403 (llm-d's status), both logged; nothing is sent to them.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import random
import re
import time
import uuid
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram

from epp.framework.keys import ENCODER_HEADER, PREFILL_HEADER, REQUEST_ID_HEADER
from epp.sidecar.allowlist import ENCODE_ROLES, Allowlist
from epp.sidecar.encoder import CHAT_PATH, EncoderFailed, run_encoders
from epp.sidecar.options import NIXLV2, SHARED_STORAGE, SidecarConfig

log = logging.getLogger(__name__)

PD_PATHS = ("/v1/chat/completions", "/v1/completions")
_HOP = {
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers", "transfer-encoding",
    "upgrade", "host", "content-length",
}  # fmt: skip
_HOSTPORT = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$")
MAX_BODY = 128 * 1024 * 1024


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter("pd_sidecar_requests", "Requests by how they were served", ["mode"], registry=r)
        self.fallbacks = Counter(
            "pd_sidecar_prefill_fallbacks", "Remote prefills that failed; the local engine prefilled", ["reason"],
            registry=r,
        )  # fmt: skip
        self.rejected = Counter("pd_sidecar_rejected", "Requests refused", ["reason"], registry=r)
        self.retries = Counter("pd_sidecar_prefill_retries", "Prefill attempts retried", registry=r)
        self.encoded = Counter(
            "pd_sidecar_encoder_requests", "Requests whose multimodal items went to encoders (E/P/D)", ["outcome"],
            registry=r,
        )  # fmt: skip
        self.encoder_items = Counter("pd_sidecar_encoder_items", "Multimodal items sent to encoders", registry=r)
        self.prefill_seconds = Histogram(
            "pd_sidecar_prefill_duration_seconds", "Remote prefill latency (successful ones)", registry=r,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )  # fmt: skip


def _error(status: int, message: str, kind: str) -> web.Response:
    body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return web.json_response(body, status=status)


class PrefillFailed(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


class SidecarProxy:
    def __init__(self, config: SidecarConfig, allowlist: Allowlist, metrics: Metrics, local_port: int) -> None:
        self.config = config
        self.allowlist = allowlist
        self.metrics = metrics
        self.local = f"{config.decoder_scheme}://127.0.0.1:{local_port}"
        self._session: aiohttp.ClientSession | None = None

    async def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            c = self.config
            verify = not (c.insecure_decoder or c.insecure_prefiller or c.insecure_encoder)
            conn = aiohttp.TCPConnector(limit=0, limit_per_host=c.max_idle_conns_per_host, ssl=verify)
            self._session = aiohttp.ClientSession(
                connector=conn, auto_decompress=False, timeout=aiohttp.ClientTimeout()
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_get("/health", self.health)
        for path in PD_PATHS:
            app.router.add_post(path, self.handle_pd)
        app.router.add_route("*", "/{tail:.*}", self.passthrough)
        app.on_cleanup.append(lambda _: self.close())
        return app

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="OK")

    # -- pass-through ----------------------------------------------------------------------------------------

    async def passthrough(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        return await self.forward_local(request, body)

    async def forward_local(self, request: web.Request, body: bytes) -> web.StreamResponse:
        """The request to the local engine; the response streamed back chunk by chunk (SSE passes through)."""
        session = await self.session()
        headers = _forward_headers(request)
        url = self.local + request.path_qs
        try:
            upstream = await session.request(request.method, url, data=body, headers=headers)
        except (aiohttp.ClientError, OSError) as e:
            log.error("local model server at %s unreachable: %s", self.local, e)
            self.metrics.rejected.labels("local_unreachable").inc()
            return _error(502, f"local model server unreachable: {e}", "BadGateway")
        async with upstream:
            resp = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for k, v in upstream.headers.items():
                if k.lower() not in _HOP:
                    resp.headers.add(k, v)
            await resp.prepare(request)
            try:
                async for chunk in upstream.content.iter_any():
                    await resp.write(chunk)
            except (aiohttp.ClientError, TimeoutError) as e:
                # The engine broke off mid-response: end ours too (the client sees a truncated body, not a hang).
                log.warning("local model server broke off the response to %s: %s", request.path, e)
                self.metrics.rejected.labels("local_broken_stream").inc()
                if request.transport is not None:
                    request.transport.close()
                return resp
            await resp.write_eof()
            return resp

    # -- P/D -------------------------------------------------------------------------------------------------

    async def handle_pd(self, request: web.Request) -> web.StreamResponse:
        hosts = _header_list(request, PREFILL_HEADER)
        encoders = _header_list(request, ENCODER_HEADER)
        if encoders and not self.config.ec_connector:
            log.debug("ignoring %s: no --ec-connector (no encoder stage)", ENCODER_HEADER)
            encoders = []
        elif encoders and request.path != CHAT_PATH:
            log.debug("ignoring %s on %s: encoders serve chat completions", ENCODER_HEADER, request.path)
            encoders = []
        body = await request.read()
        if not hosts and not encoders:
            self.metrics.requests.labels("local").inc()
            return await self.forward_local(request, body)
        target = ""
        if hosts:
            target = random.choice(hosts) if self.config.enable_prefiller_sampling else hosts[0]
            refused = self._refuse(request, PREFILL_HEADER, target, "prefill target")
            if refused is not None:
                return refused
        allowed: list[str] = []
        for host in encoders:
            if not _valid_hostport(host):
                return self._malformed(request, ENCODER_HEADER, host)
            if self.allowlist.allowed(host, ENCODE_ROLES):
                allowed.append(host)
            else:
                log.warning(
                    "SSRF protection: encoder target %s not in the allowlist, removed (client %s)", host, request.remote
                )
                self.metrics.rejected.labels("ssrf_denied_encoder").inc()
        if encoders and not allowed:
            log.warning("SSRF protection: every encoder target was refused; no encoder stage")
        if not target and not allowed:
            self.metrics.requests.labels("local").inc()
            return await self.forward_local(request, body)
        try:
            parsed = json.loads(body)
        except ValueError:
            self.metrics.rejected.labels("bad_json").inc()
            return _error(400, "request body is not valid JSON", "BadRequestError")
        if not isinstance(parsed, dict):
            self.metrics.rejected.labels("bad_json").inc()
            return _error(400, "request body must be a JSON object", "BadRequestError")
        rid = request.headers.get(REQUEST_ID_HEADER) or str(uuid.uuid4())
        if allowed:
            c = self.config
            try:
                n, params = await run_encoders(
                    await self.session(), c.ec_connector, c.encoder_scheme, allowed, parsed, rid, c.prefill_timeout
                )
            except EncoderFailed as e:
                log.error("request %s: encoder stage failed: %s", rid, e)
                self.metrics.encoded.labels("failed").inc()
                return _error(502, f"encoder stage failed: {e}", "BadGateway")
            self.metrics.encoded.labels("ok").inc()
            self.metrics.encoder_items.inc(n)
            if params is not None:
                parsed["ec_transfer_params"] = params
            parsed["cache_hit_threshold"] = 0  # the encoder ran: the prefill must run (llm-d's runPDPipeline)
            body = json.dumps(parsed).encode()
            if not target:
                self.metrics.requests.labels("local").inc()
                return await self.forward_local(request, body)
        t0 = time.monotonic()
        try:
            decode_body = await self.prefill(request, target, parsed, rid)
        except PrefillFailed as e:
            log.warning("request %s: prefill on %s failed (%s: %s); prefilling locally", rid, target, e.reason, e)
            self.metrics.fallbacks.labels(e.reason).inc()
            self.metrics.requests.labels("local_fallback").inc()
            return await self.forward_local(request, body)
        self.metrics.prefill_seconds.observe(time.monotonic() - t0)
        self.metrics.requests.labels("disaggregated").inc()
        log.debug("request %s: prefilled on %s in %.3fs; decoding locally", rid, target, time.monotonic() - t0)
        return await self.forward_local(request, json.dumps(decode_body).encode())

    def _malformed(self, request: web.Request, header: str, value: str) -> web.Response:
        log.warning("request from %s: malformed %s %r; refused", request.remote, header, value[:200])
        self.metrics.rejected.labels("malformed_header").inc()
        return _error(400, f"malformed {header} header: expected host:port", "BadRequestError")

    def _refuse(self, request: web.Request, header: str, target: str, what: str) -> web.Response | None:
        if not _valid_hostport(target):
            return self._malformed(request, header, target)
        if not self.allowlist.allowed(target):
            log.error(
                "SSRF protection: %s %s not in the allowlist (client %s, path %s)",
                what, target, request.remote, request.path,
            )  # fmt: skip
            self.metrics.rejected.labels("ssrf_denied").inc()
            return _error(403, "Forbidden: prefill target not allowed by SSRF protection", "PermissionDeniedError")
        return None

    def prefill_body(self, parsed: dict[str, Any]) -> dict[str, Any]:
        p = copy.copy(parsed)
        p["stream"] = False
        p.pop("stream_options", None)
        p["max_tokens"] = 1
        if "max_completion_tokens" in p:
            p["max_completion_tokens"] = 1
        if self.config.kv_connector == NIXLV2:
            p["kv_transfer_params"] = {
                "do_remote_decode": True,
                "do_remote_prefill": False,
                "remote_engine_id": None,
                "remote_block_ids": None,
                "remote_host": None,
                "remote_port": None,
            }
        else:  # shared-storage: the prefiller writes the KV cache where the decoder reads it
            p["cache_hit_threshold"] = 0
        return p

    async def prefill(self, request: web.Request, target: str, parsed: dict[str, Any], rid: str) -> dict[str, Any]:
        """Run the prefill on `target`; the body the local decode gets (PrefillFailed: decode locally)."""
        c = self.config
        payload = json.dumps(self.prefill_body(parsed)).encode()
        headers = {k: v for k, v in _forward_headers(request).items() if k.lower() != "accept-encoding"}
        headers[REQUEST_ID_HEADER] = rid
        headers["content-type"] = "application/json"
        url = f"{c.prefiller_scheme}://{target}{request.path_qs}"
        session = await self.session()
        timeout = aiohttp.ClientTimeout(total=c.prefill_timeout)
        attempt = 0
        while True:
            try:
                async with session.post(url, data=payload, headers=headers, timeout=timeout) as r:
                    raw = await r.read()
                    status = r.status
            except TimeoutError:
                failure = PrefillFailed("timeout", f"no answer within {c.prefill_timeout:g}s")
            except (aiohttp.ClientError, OSError) as e:
                failure = PrefillFailed("unreachable", str(e) or type(e).__name__)
            else:
                if status < 400:
                    break
                failure = PrefillFailed(f"status_{status // 100}xx", f"HTTP {status}: {raw[:200]!r}")
                if status < 500:
                    raise failure
            if attempt >= c.prefill_max_retries:
                raise failure
            attempt += 1
            self.metrics.retries.inc()
            log.info("request %s: retrying prefill on %s (attempt %d): %s", rid, target, attempt + 1, failure)
            await asyncio.sleep(c.prefill_retry_backoff)
        try:
            answer = json.loads(raw)
        except ValueError:
            raise PrefillFailed("bad_response", "the prefiller's answer is not JSON") from None
        decode = dict(parsed)
        if c.kv_connector == NIXLV2:
            params = answer.get("kv_transfer_params") if isinstance(answer, dict) else None
            if not isinstance(params, dict):
                raise PrefillFailed("no_kv_transfer_params", "the prefiller returned no kv_transfer_params")
            decode["kv_transfer_params"] = params
        elif c.kv_connector == SHARED_STORAGE:
            decode["cache_hit_threshold"] = 0
        return decode


def _header_list(request: web.Request, name: str) -> list[str]:
    """A comma-separated host list header (one or several header lines), blanks dropped."""
    return [h.strip() for v in request.headers.getall(name, []) for h in v.split(",") if h.strip()]


def _valid_hostport(value: str) -> bool:
    return bool(_HOSTPORT.match(value)) and 0 < int(value.rsplit(":", 1)[1]) < 65536


def _forward_headers(request: web.Request) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in request.headers.items():
        lk = k.lower()
        if lk in _HOP or lk in (PREFILL_HEADER, ENCODER_HEADER):
            continue
        out[k] = v
    return out
