"""aiohttp app: vLLM's OpenAI-compatible API, /tokenize, render endpoints, /metrics and admin endpoints.

Errors are vLLM-shaped JSON (`{"error": {"message", "type", "param", "code"}}`) with the HTTP status.
Admin endpoints (failure injection and state) live under `/admin/`; `/reset_prefix_cache` is vLLM's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, fields
from typing import Any

from aiohttp import web

from e2e.sim.config import SimConfig
from e2e.sim.encode import EncoderStage
from e2e.sim.engine import Engine, EngineError, SimRequest
from e2e.sim.events import KVEvent
from e2e.sim.kvcache import LoraRef
from e2e.sim.metrics import SimMetrics
from e2e.sim.multimodal import VisionRenderer
from e2e.sim.publisher import EventPublisher
from e2e.sim.tokenizer import RenderError, SimTokenizer

log = logging.getLogger("e2e.sim")

OUTPUT_TEXT = " The quick brown fox jumps over the lazy dog."
RUNTIME_SETTABLE = {
    "prefill_overhead", "prefill_time_per_token", "inter_token_latency", "time_factor_under_load",
    "failure_rate", "failure_status", "max_num_seqs", "prefill_tokens_per_second",
    "kv_transfer_overhead", "kv_transfer_time_per_block", "prefill_interference", "num_gpu_blocks",
    "kv_events_drop_rate", "omit_kv_transfer_params", "prompt_tokens_details",
}  # fmt: skip

APP_KEY: web.AppKey[Simulator] = web.AppKey("simulator")


def error_response(
    status: int, message: str, err_type: str = "BadRequestError", param: str | None = None
) -> web.Response:
    body = {"error": {"message": message, "type": err_type, "param": param, "code": status}}
    return web.json_response(body, status=status)


class Simulator:
    """State of one simulated vLLM server (tokenizer, engine, metrics, event publisher)."""

    def __init__(self, cfg: SimConfig, tokenizer: SimTokenizer | None = None, allow_crash: bool = True) -> None:
        self.cfg = cfg
        self.allow_crash = allow_crash  # False when running inside a test process
        self.tok = tokenizer or SimTokenizer()
        self.metrics = SimMetrics(
            model_name=cfg.model_name,
            block_size=cfg.block_size,
            num_gpu_blocks=cfg.num_gpu_blocks,
            max_loras=cfg.max_loras,
            enable_prefix_caching=cfg.enable_prefix_caching,
            legacy_gpu_cache_metric=cfg.legacy_gpu_cache_metric,
            ranks=tuple(cfg.ranks),
        )
        output_ids = self.tok.encode(OUTPUT_TEXT)
        self.pieces = {i: self.tok.decode([i]) for i in output_ids}  # generated text without the tokenizer
        self.engines = [Engine(cfg, self.metrics.engine(r), output_ids, rank=r) for r in cfg.ranks]
        self.encoder = EncoderStage(cfg, self.metrics.registry)  # E/P/D: multimodal items' encoder outputs
        self.vision = VisionRenderer(cfg.model) if cfg.multimodal else None  # --multimodal: image parts rendered
        self.metrics.bind(
            lambda: (
                [(e.rank, len(e.running), len(e.waiting), e.kv.usage()) for e in self.engines],
                sorted({n for e in self.engines for n in e.running_loras()}),
                sorted({n for e in self.engines for n in e.waiting_loras()}),
            )
        )
        self.publishers: list[EventPublisher] = []
        self.started = time.monotonic()
        self.ready_at = self.started + cfg.startup_delay
        self.rng = random.Random(cfg.seed)
        self._drop_rng = random.Random(cfg.seed + 1)
        self.events_lost = 0  # --kv-events-drop-rate
        self.metrics_requests = 0  # GET /metrics served (a test counts the EPP's scrapes)
        self.created = int(time.time())

    @property
    def engine(self) -> Engine:
        """The first (often only) data-parallel engine."""
        return self.engines[0]

    @property
    def publisher(self) -> EventPublisher | None:
        return self.publishers[0] if self.publishers else None

    def pick_engine(self, request: web.Request) -> Engine:
        """vLLM's DP routing: the `X-data-parallel-rank` header if given, else the least loaded engine."""
        want = request.headers.get("X-data-parallel-rank")
        if want is not None:
            for e in self.engines:
                if str(e.rank) == want.strip():
                    return e
            raise EngineError(400, f"X-data-parallel-rank {want!r} is not one of {self.cfg.ranks}.")
        return min(self.engines, key=lambda e: (e.load(), e.rank))

    async def start_events(self) -> None:
        if not self.cfg.kv_events_endpoint:
            return
        for engine in self.engines:
            pub = EventPublisher(
                endpoint=self.cfg.kv_events_endpoint,
                replay_endpoint=self.cfg.kv_events_replay_endpoint,
                topic=self.cfg.topic,
                data_parallel_rank=engine.rank,
                encoding=self.cfg.kv_events_encoding,
                buffer_steps=self.cfg.kv_events_buffer_steps,
                hwm=self.cfg.kv_events_hwm,
                force_bind=self.cfg.kv_events_bind,
                count_subscribers=self.cfg.kv_events_count_subscribers,
            )
            pub.mode = self.cfg.kv_events_mode
            pub.start()
            engine.on_events(self._lossy(pub))
            self.publishers.append(pub)

    def _lossy(self, pub: EventPublisher) -> Callable[[list[KVEvent]], None]:
        return lambda events: pub.publish(self._lose(events))

    def _lose(self, events: list[KVEvent]) -> list[KVEvent]:
        """--kv-events-drop-rate: silently lose that share of the events before they are numbered and buffered
        (an engine that never announces them): no sequence gap, nothing a replay could recover."""
        rate = self.cfg.kv_events_drop_rate
        if rate <= 0:
            return events
        types = self.cfg.kv_events_drop_types
        kept = [e for e in events if (types and type(e).__name__ not in types) or self._drop_rng.random() >= rate]
        self.events_lost += len(events) - len(kept)
        return kept

    async def stop_events(self) -> None:
        for pub in self.publishers:
            await pub.close()

    @property
    def ready(self) -> bool:
        return time.monotonic() >= self.ready_at

    # --- request parsing --------------------------------------------------------------------------------
    def sim_request(self, body: dict[str, Any], ids: list[int], lora: LoraRef | None, chat: bool) -> SimRequest:
        max_tokens = body.get("max_completion_tokens") if chat else None
        if max_tokens is None:
            max_tokens = body.get("max_tokens")
        if max_tokens is None:
            max_tokens = self.cfg.default_max_tokens
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise EngineError(400, "`max_tokens` must be a positive integer.")
        salt = body.get("cache_salt")
        if salt is not None and not isinstance(salt, str):
            raise EngineError(400, "`cache_salt` must be a string.")
        return SimRequest(prompt_ids=ids, max_tokens=max_tokens, lora=lora, cache_salt=salt or None)

    def failure(self) -> EngineError | None:
        """Why this request must fail now (starting up, or an injected failure), or None."""
        if not self.ready:
            return EngineError(503, "The server is starting up.", "ServiceUnavailableError")
        if self.cfg.failure_rate > 0 and self.rng.random() < self.cfg.failure_rate:
            status = self.cfg.failure_status
            kind = {429: "RateLimitError", 400: "BadRequestError", 404: "NotFoundError"}.get(
                status, "InternalServerError"
            )
            return EngineError(status, "Injected failure.", kind)
        return None

    def maybe_fail(self) -> web.Response | None:
        err = self.failure()
        return None if err is None else error_response(err.status, err.message, err.err_type)

    def headers(self) -> dict[str, str]:
        return {"x-inference-pod": self.cfg.pod, "x-inference-port": str(self.cfg.port)}


async def _json(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise EngineError(400, f"Invalid JSON body: {e}") from e
    if not isinstance(body, dict):
        raise EngineError(400, "The request body must be a JSON object.")
    return body


def _usage(prompt: int, completion: int, cached: int | None) -> dict[str, Any]:
    """`cached` None: no prompt_tokens_details (vLLM without --enable-prompt-tokens-details)."""
    usage: dict[str, Any] = {"prompt_tokens": prompt, "total_tokens": prompt + completion}
    usage["completion_tokens"] = completion
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return usage


@web.middleware
async def errors_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        return await handler(request)
    except EngineError as e:
        return error_response(e.status, e.message, e.err_type)
    except RenderError as e:
        return error_response(400, str(e))
    except web.HTTPException:
        raise
    except Exception as e:
        log.exception("internal error on %s %s", request.method, request.path)
        return error_response(500, f"Internal error: {type(e).__name__}: {e}", "InternalServerError")


# --- generation ------------------------------------------------------------------------------------------
async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=False)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=True)


async def _prompt(sim: Simulator, body: dict[str, Any], chat: bool) -> list[int]:
    if chat:
        return await sim.tok.messages_ids(
            body.get("messages"),
            add_generation_prompt=bool(body.get("add_generation_prompt", True)),
            continue_final_message=bool(body.get("continue_final_message", False)),
            chat_template_kwargs=body.get("chat_template_kwargs") or None,
        )
    prompts = await sim.tok.prompt_ids(body.get("prompt"))
    if len(prompts) != 1:
        raise EngineError(400, "The simulator serves one prompt per request.")
    return prompts[0]


@dataclass
class Generation:
    """One parsed request ready to run: every API's answer (chat, completions, Messages, Responses) is built from
    its pieces and counts. The engine generates `max_tokens` tokens; when the client set that limit, reaching it is
    a `length` finish (as vLLM's), else the answer ends there on its own (`stop`)."""

    sim: Simulator
    engine: Engine
    req: SimRequest
    model: str
    limited: bool
    transfer: bool = False
    ec_params: dict[str, Any] | None = None
    out: int = 0

    async def pieces(self) -> AsyncIterator[str]:
        """The generated text, token by token (`out` counts them)."""
        async with contextlib.aclosing(self.engine.generate(self.req)) as gen:
            async for t in gen:
                self.out += 1
                yield self.sim.pieces[t.token_id]

    async def text(self) -> str:
        return "".join([p async for p in self.pieces()])

    @property
    def last(self) -> bool:
        return self.out >= self.req.max_tokens

    @property
    def finish(self) -> str:
        return "length" if self.limited else "stop"

    @property
    def prompt_tokens(self) -> int:
        return len(self.req.prompt_ids)

    @property
    def cached(self) -> int | None:
        """Cached prompt tokens, or None when the server does not report them (no --enable-prompt-tokens-details)."""
        return self.req.cached_tokens if self.sim.cfg.prompt_tokens_details else None

    def extras(self) -> dict[str, Any]:
        """vLLM's extra response fields: P/D `kv_transfer_params`, E/P/D `ec_transfer_params`."""
        out: dict[str, Any] = {}
        if self.transfer and not self.sim.cfg.omit_kv_transfer_params:
            out["kv_transfer_params"] = kv_transfer_response(self.sim, self.engine, self.req)
        if self.ec_params:
            out["ec_transfer_params"] = self.ec_params
        return out


async def prepare(request: web.Request, chat: bool, body: dict[str, Any]) -> Generation:
    """Parse and tokenize a chat or completions body (another API's request already converted to one)."""
    sim = request.app[APP_KEY]
    model = body.get("model", sim.cfg.model_name)
    if not isinstance(model, str):
        raise EngineError(400, "`model` must be a string.")
    engine = sim.pick_engine(request)
    lora = engine.lora_for(model)
    if body.get("n", 1) != 1:
        raise EngineError(400, "The simulator supports only n=1.")
    mm: list[tuple[str, int, int]] = []
    if chat and sim.vision is not None:
        ids, mm = await sim.vision.render(body)
    else:
        ids = await _prompt(sim, body, chat)
    req = sim.sim_request(body, ids, lora, chat)
    req.mm = mm
    limited = body.get("max_tokens") is not None or (chat and body.get("max_completion_tokens") is not None)
    gen = Generation(sim, engine, req, model, limited=limited)
    gen.transfer = kv_transfer_request(body, req)
    gen.ec_params = await sim.encoder.run(body) if chat else None
    return gen


async def _generate(request: web.Request, chat: bool, body: dict[str, Any] | None = None) -> web.StreamResponse:
    """`body`: a request of another API already converted to a chat or completions body (e2e.sim.apis)."""
    sim = request.app[APP_KEY]
    fail = sim.maybe_fail()
    if fail is not None:
        return fail
    if body is None:
        body = await _json(request)
    gen = await prepare(request, chat, body)
    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
    created = int(time.time())
    if body.get("stream"):
        opts = body.get("stream_options") or {}
        if not isinstance(opts, dict):
            raise EngineError(400, "`stream_options` must be an object.")
        return await _stream(request, gen, rid, created, chat, bool(opts.get("include_usage")))
    text = await gen.text()
    choice: dict[str, Any]
    if chat:
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text, "tool_calls": []},
            "logprobs": None,
            "finish_reason": gen.finish,
            "stop_reason": None,
        }
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": gen.finish, "stop_reason": None}
    resp = {
        "id": rid,
        "object": "chat.completion" if chat else "text_completion",
        "created": created,
        "model": gen.model,
        "choices": [choice],
        "usage": _usage(gen.prompt_tokens, gen.out, gen.cached),
        **gen.extras(),
    }
    return web.json_response(resp, headers=sim.headers())


def sse(data: dict[str, Any], event: str | None = None) -> bytes:
    """One server-sent event (`event:` line as the Anthropic and Responses APIs send, none for chat/completions)."""
    line = b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"
    return b"event: " + event.encode() + b"\n" + line if event else line


async def stream_events(
    request: web.Request,
    gen: Generation,
    head: Callable[[], list[bytes]],
    piece: Callable[[str], list[bytes]],
    tail: Callable[[], list[bytes]],
) -> web.StreamResponse:
    """An SSE answer: `head` once the first token is out (errors before it are still JSON answers), `piece` per
    token (`gen.last` tells the last one), `tail` after the last. A client that goes away cancels the request."""
    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", **gen.sim.headers()}
    )
    prepared = False
    try:
        async for text in gen.pieces():
            if not prepared:
                await resp.prepare(request)
                prepared = True
                for b in head():
                    await resp.write(b)
            for b in piece(text):
                await resp.write(b)
        for b in tail():
            await resp.write(b)
        await resp.write_eof()
    except ConnectionResetError:
        log.info("client went away mid-stream (%s); request cancelled", request.path)
    return resp


async def _stream(
    request: web.Request, gen: Generation, rid: str, created: int, chat: bool, usage: bool
) -> web.StreamResponse:
    obj = "chat.completion.chunk" if chat else "text_completion"

    def chunk(choices: list[dict[str, Any]], extra: dict[str, Any] | None = None) -> bytes:
        return sse(
            {"id": rid, "object": obj, "created": created, "model": gen.model, "choices": choices, **(extra or {})}
        )

    def head() -> list[bytes]:
        if not chat:
            return []
        return [
            chunk(
                [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}]
            )
        ]

    def piece(text: str) -> list[bytes]:
        finish = gen.finish if gen.last else None
        if chat:
            return [chunk([{"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": finish}])]
        return [chunk([{"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None}])]

    def tail() -> list[bytes]:
        out = [chunk([], {"usage": _usage(gen.prompt_tokens, gen.out, gen.cached)})] if usage else []
        return [*out, b"data: [DONE]\n\n"]

    return await stream_events(request, gen, head, piece, tail)


# --- P/D: vLLM's NIXL connector protocol (kv_transfer_params) -------------------------------------------
def kv_transfer_request(body: dict[str, Any], req: SimRequest) -> bool:
    """Read `kv_transfer_params`: do_remote_decode (we prefill for a remote decoder: answer with our block ids) or
    do_remote_prefill with remote_block_ids (we decode: pull those blocks instead of computing the prefill).
    Malformed params are a 400, as vLLM's validation; absent ones change nothing. True if we must answer them."""
    params = body.get("kv_transfer_params")
    if params is None:
        return False
    if not isinstance(params, dict):
        raise EngineError(400, "`kv_transfer_params` must be an object.")
    if params.get("do_remote_decode"):
        req.remote_decode = True
        return True
    if params.get("do_remote_prefill"):
        blocks = params.get("remote_block_ids")
        if not isinstance(blocks, list) or not all(isinstance(b, int) and not isinstance(b, bool) for b in blocks):
            raise EngineError(400, "`kv_transfer_params.remote_block_ids` must be a list of block ids.")
        req.remote_blocks = blocks
    return False


def kv_transfer_response(sim: Simulator, engine: Engine, req: SimRequest) -> dict[str, Any]:
    return {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_block_ids": req.block_ids,
        "remote_engine_id": f"{sim.cfg.pod}-{engine.rank}",
        "remote_host": sim.cfg.pod_ip,
        "remote_port": sim.cfg.port,
        "tp_size": 1,
    }


# --- models, health, tokenize, render -------------------------------------------------------------------
async def models(request: web.Request) -> web.Response:
    sim = request.app[APP_KEY]
    card = {
        "object": "model", "created": sim.created, "owned_by": "vllm", "root": sim.cfg.model,
        "parent": None, "max_model_len": sim.cfg.max_model_len, "permission": [],
    }  # fmt: skip
    data = [{"id": sim.cfg.model_name, **card}]
    for name, lora in sim.engine.loras.items():
        data.append({**card, "id": name, "root": lora.path, "parent": sim.cfg.model_name})
    return web.json_response({"object": "list", "data": data})


async def health(request: web.Request) -> web.Response:
    sim = request.app[APP_KEY]
    if not sim.ready:
        return web.Response(status=503)
    return web.Response(status=200)


async def tokenize(request: web.Request) -> web.Response:
    """vLLM's /tokenize: {prompt | messages, add_special_tokens, add_generation_prompt, return_token_strs}."""
    sim = request.app[APP_KEY]
    body = await _json(request)
    if "messages" in body:
        ids = await sim.tok.messages_ids(
            body["messages"],
            add_generation_prompt=bool(body.get("add_generation_prompt", True)),
            continue_final_message=bool(body.get("continue_final_message", False)),
            chat_template_kwargs=body.get("chat_template_kwargs") or None,
            add_special_tokens=bool(body.get("add_special_tokens", False)),
        )
    elif isinstance(body.get("prompt"), str):
        (ids,) = await sim.tok.prompt_ids(body["prompt"], bool(body.get("add_special_tokens", True)))
    else:
        raise EngineError(400, "/tokenize needs a string `prompt` or `messages`.")
    strs = await sim.tok.run(sim.tok.token_strs, ids) if body.get("return_token_strs") else None
    return web.json_response(
        {"count": len(ids), "max_model_len": sim.cfg.max_model_len, "tokens": ids, "token_strs": strs}
    )


async def detokenize(request: web.Request) -> web.Response:
    sim = request.app[APP_KEY]
    body = await _json(request)
    ids = sim.tok.check_ids(body.get("tokens"))
    return web.json_response({"prompt": await sim.tok.run(sim.tok.decode, ids, size=len(ids) * 4)})


def _rendered(sim: Simulator, body: dict[str, Any], ids: list[int], chat: bool) -> dict[str, Any]:
    """vLLM's render output, a `GenerateRequest` (token ids plus sampling params) ready for /inference/v1/generate."""
    max_tokens = body.get("max_completion_tokens") if chat else None
    if max_tokens is None:
        max_tokens = body.get("max_tokens")
    return {
        "request_id": uuid.uuid4().hex,
        "token_ids": ids,
        "token_offsets": None,
        "features": None,
        "content_parts": None,
        "sampling_params": {"max_tokens": max_tokens, "temperature": body.get("temperature"), "n": 1},
        "model": body.get("model", sim.cfg.model_name),
        "stream": bool(body.get("stream", False)),
        "stream_options": body.get("stream_options"),
        "cache_salt": body.get("cache_salt"),
    }


async def render_chat(request: web.Request) -> web.Response:
    sim = request.app[APP_KEY]
    body = await _json(request)
    sim.engine.lora_for(str(body.get("model", sim.cfg.model_name)))
    if sim.vision is not None:  # vLLM's render output carries the items' hashes and placeholder ranges
        ids, mm = await sim.vision.render(body)
        out = _rendered(sim, body, ids, chat=True)
        if mm:
            out["features"] = {
                "mm_hashes": {"image": [h for h, _, _ in mm]},
                "mm_placeholders": {"image": [{"offset": o, "length": n} for _, o, n in mm]},
            }
        return web.json_response(out)
    ids = await _prompt(sim, body, chat=True)
    return web.json_response(_rendered(sim, body, ids, chat=True))


async def render_completion(request: web.Request) -> web.Response:
    sim = request.app[APP_KEY]
    body = await _json(request)
    sim.engine.lora_for(str(body.get("model", sim.cfg.model_name)))
    prompts = await sim.tok.prompt_ids(body.get("prompt"))
    return web.json_response([_rendered(sim, body, ids, chat=False) for ids in prompts])


async def metrics(request: web.Request) -> web.Response:
    sim = request.app[APP_KEY]
    sim.metrics_requests += 1
    return web.Response(body=sim.metrics.render(), headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


async def reset_prefix_cache(request: web.Request) -> web.Response:
    sim = request.app[APP_KEY]
    if not all([e.reset_prefix_cache() for e in sim.engines]):
        return error_response(409, "Failed to reset prefix cache because some blocks are in use.", "ConflictError")
    return web.Response(status=200)


# --- admin / failure injection ---------------------------------------------------------------------------
async def admin_state(request: web.Request) -> web.Response:
    sim = request.app[APP_KEY]
    engines = [
        {
            "rank": e.rank,
            "running": len(e.running),
            "waiting": len(e.waiting),
            "kv": {"num_blocks": e.kv.num_blocks, "used": e.kv.used_blocks, "cached": e.kv.cached_blocks},
        }
        for e in sim.engines
    ]
    events = [
        {
            "rank": p.rank,
            "endpoint": p.endpoint,
            "replay_endpoint": p.replay_endpoint,
            "topic": p.topic.decode(),
            "next_seq": p.seq,
            "mode": p.mode,
            "events_lost": sim.events_lost,
            "connections": p.connections,
            "subscribers": p.subscribers,
        }
        for p in sim.publishers
    ]
    return web.json_response(
        {
            **{k: v for k, v in engines[0].items() if k != "rank"},  # rank 0 (the only one without DP)
            "events": events[0] if events else None,
            "engines": engines,
            "publishers": events,
            "config": {k: getattr(sim.cfg, k) for k in sorted(RUNTIME_SETTABLE)},
            "role": sim.cfg.role,
            "metrics_requests": sim.metrics_requests,
        }
    )


async def admin_config(request: web.Request) -> web.Response:
    """Change latency / failure parameters at run time: {"failure_rate": 0.5, "inter_token_latency": 0.01, ...}."""
    sim = request.app[APP_KEY]
    body = await _json(request)
    types = {f.name: f.type for f in fields(SimConfig)}
    for key, value in body.items():
        if key not in RUNTIME_SETTABLE:
            raise EngineError(400, f"`{key}` cannot be changed at run time (allowed: {sorted(RUNTIME_SETTABLE)}).")
        if types[key] in (bool, "bool"):
            if not isinstance(value, bool):
                raise EngineError(400, f"`{key}` must be true or false.")
            setattr(sim.cfg, key, value)
            continue
        want = int if types[key] in (int, "int") else float
        if (
            not isinstance(value, int | float)
            or isinstance(value, bool)
            or (want is int and not isinstance(value, int))
        ):
            raise EngineError(400, f"`{key}` must be a number.")
        if key == "num_gpu_blocks":  # the KV capacity: only while no block is in use, and the cache is cleared
            if value <= 0 or any(e.kv.used_blocks for e in sim.engines):
                raise EngineError(
                    409, "`num_gpu_blocks` must be positive and can only change while the engine is idle."
                )
            for e in sim.engines:
                e.kv.reset()
                e.kv.num_blocks = int(value)
            sim.metrics.set_num_gpu_blocks(int(value))
        setattr(sim.cfg, key, want(value))
    for e in sim.engines:
        e.schedule()
    return await admin_state(request)


async def admin_events(request: web.Request) -> web.Response:
    """{"mode": "on"|"off"|"lossy"} and/or {"restart": true} (publisher restarts, sequence back at 0), for every
    rank or only `"rank": r`."""
    sim = request.app[APP_KEY]
    body = await _json(request)
    if not sim.publishers:
        raise EngineError(400, "KV events are not enabled (--kv-events-endpoint).")
    rank = body.get("rank")
    pubs = [p for p in sim.publishers if rank is None or p.rank == rank]
    if not pubs:
        raise EngineError(400, f"no publisher for rank {rank!r}.")
    mode = body.get("mode")
    if mode is not None and mode not in ("on", "off", "lossy"):
        raise EngineError(400, "`mode` must be on, off or lossy.")
    for pub in pubs:
        if mode is not None:
            pub.mode = mode
        if body.get("restart"):
            await pub.restart()
    return await admin_state(request)


async def admin_unready(request: web.Request) -> web.Response:
    """{"seconds": S}: answer 503 (health and requests) for S seconds, like a slow (re)start."""
    sim = request.app[APP_KEY]
    body = await _json(request)
    seconds = body.get("seconds", 0)
    if not isinstance(seconds, int | float) or seconds < 0:
        raise EngineError(400, "`seconds` must be a non-negative number.")
    sim.ready_at = time.monotonic() + float(seconds)
    return web.json_response({"ready_in": float(seconds)})


async def admin_crash(request: web.Request) -> web.Response:
    """Exit the process abruptly (exit code 1, no cleanup), shortly after answering."""
    if not request.app[APP_KEY].allow_crash:
        raise EngineError(409, "This simulator runs inside another process; /admin/crash needs a subprocess.")
    asyncio.get_running_loop().call_later(0.05, _crash, "/admin/crash")
    return web.json_response({"crashing": True})


def build_app(sim: Simulator, manage_events: bool = True) -> web.Application:
    """The app; with `manage_events` its startup/cleanup also starts/stops the KV-event publisher."""
    app = web.Application(middlewares=[errors_middleware], client_max_size=64 * 1024 * 1024)
    app[APP_KEY] = sim
    r = app.router
    r.add_post("/v1/completions", completions)
    r.add_post("/v1/chat/completions", chat_completions)
    from e2e.sim.apis import add_api_routes  # it builds on this module's generation

    add_api_routes(r)  # /v1/messages, /v1/responses, /inference/v1/generate (e2e.sim.apis)
    r.add_post("/v1/completions/render", render_completion)
    r.add_post("/v1/chat/completions/render", render_chat)
    r.add_get("/v1/models", models)
    r.add_get("/health", health)
    r.add_get("/health/ready", health)
    r.add_post("/tokenize", tokenize)
    r.add_post("/detokenize", detokenize)
    r.add_get("/metrics", metrics)
    r.add_post("/reset_prefix_cache", reset_prefix_cache)
    r.add_get("/admin/state", admin_state)
    r.add_post("/admin/config", admin_config)
    r.add_post("/admin/events", admin_events)
    r.add_post("/admin/unready", admin_unready)
    r.add_post("/admin/crash", admin_crash)

    async def on_startup(app: web.Application) -> None:
        await sim.start_events()

    async def on_cleanup(app: web.Application) -> None:
        await sim.stop_events()

    async def close_vision(app: web.Application) -> None:
        if sim.vision is not None:
            await sim.vision.close()

    if manage_events:
        app.on_startup.append(on_startup)
        app.on_cleanup.append(on_cleanup)
    app.on_cleanup.append(close_vision)
    return app


@dataclass
class RunningSim:
    sim: Simulator
    runner: web.AppRunner

    def ready_info(self) -> dict[str, Any]:
        pubs = self.sim.publishers
        return {
            "http_port": self.sim.cfg.port,
            "kv_events_endpoint": pubs[0].endpoint if pubs else None,
            "kv_events_replay_endpoint": pubs[0].replay_endpoint if pubs else None,
            "kv_events_endpoints": [p.endpoint for p in pubs],  # one per data-parallel rank
            "kv_events_replay_endpoints": [p.replay_endpoint for p in pubs],
            "topic": self.sim.cfg.topic,
            "role": self.sim.cfg.role,
        }

    async def close(self) -> None:
        await self.sim.stop_events()
        await self.runner.cleanup()


async def start_server(cfg: SimConfig, tokenizer: SimTokenizer | None = None, allow_crash: bool = True) -> RunningSim:
    """Serve on cfg.host:cfg.port (0 = any free port, written back to cfg.port before the topic is fixed)."""
    sim = Simulator(cfg, tokenizer, allow_crash=allow_crash)
    runner = web.AppRunner(build_app(sim, manage_events=False), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, cfg.host, cfg.port, reuse_address=True)
    await site.start()
    if cfg.port == 0:
        server: Any = site._server
        cfg.port = int(server.sockets[0].getsockname()[1])
    await sim.start_events()
    if cfg.crash_after > 0:
        if not allow_crash:
            raise ValueError("--crash-after needs a subprocess simulator")
        asyncio.get_running_loop().call_later(cfg.crash_after, _crash, "--crash-after")
    return RunningSim(sim, runner)


def _crash(why: str) -> None:
    log.warning("crashing (%s)", why)
    os._exit(1)
