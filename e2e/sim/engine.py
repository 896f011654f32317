"""The simulated engine: admission (max-num-seqs, KV space, max LoRAs), the latency model, and the KV cache.

TTFT = queueing + (prefill_overhead + uncached prompt tokens x prefill_time_per_token) x load factor;
each further output token takes inter_token_latency x load factor. The load factor grows linearly
from 1 (one running request) to `time_factor_under_load` (max-num-seqs running), as in
llm-d-inference-sim. Everything is real time (asyncio sleeps), so routing choices show up in measured
latency.

With `prefill_tokens_per_second` > 0 prefill is the engine's shared resource, as with vLLM's chunked
prefill: admitted requests prefill one after the other (FCFS) at that many uncached tokens per second
(plus prefill_overhead), so a pod that receives much uncached work builds a prefill backlog; a request's cache hit
is looked up again when its prefill starts (as vLLM looks it up when it schedules the prefill), so it reuses what
the prefills ahead of it computed; only the
prefill being computed counts for `prefill_interference` (decode steps slowed while prefills share the
engine). `time_scale` multiplies every modelled duration, so a workload can be replayed time-compressed.

With `max_num_batched_tokens` > 0 as well, the shared prefill is vLLM's chunked prefill step by step: each engine
step carries at most that many prefill tokens next to the running decodes, so a prefill of N tokens takes
ceil(N / budget) steps of (decode step + chunk / prefill_tokens_per_second), and a decode step taken while a prefill
is computing is slowed by its chunk's compute (chunk / prefill_tokens_per_second) — the interference P/D removes,
derived from the prefill rate instead of the `prefill_interference` factor.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field

from e2e.sim.config import SimConfig
from e2e.sim.events import KVEvent
from e2e.sim.kvcache import Allocation, KVCache, LoraRef, NoSpace
from e2e.sim.metrics import EngineMetrics

HASH_THREAD_THRESHOLD_TOKENS = 8192


class EngineError(Exception):
    def __init__(self, status: int, message: str, err_type: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type


@dataclass
class SimRequest:
    prompt_ids: list[int]
    max_tokens: int
    lora: LoraRef | None = None
    cache_salt: str | None = None
    arrival: float = field(default_factory=time.monotonic)
    hashes: list[bytes] = field(default_factory=list)
    alloc: Allocation | None = None
    cached_tokens: int = 0
    admitted: asyncio.Future[None] | None = None
    # P/D: blocks a prefiller computed for this decode (kv_transfer_params.remote_block_ids), or None
    remote_blocks: list[int] | None = None
    remote_decode: bool = False  # this is the prefill of a disaggregated request
    block_ids: list[int] = field(default_factory=list)  # the prompt's blocks here, for kv_transfer_params
    mm: list[tuple[str, int, int]] = field(default_factory=list)  # multimodal items (hash, offset, length)


@dataclass
class Token:
    """One generated token (index from 0), with its timing."""

    index: int
    token_id: int
    first: bool


class Engine:
    def __init__(self, cfg: SimConfig, metrics: EngineMetrics, output_ids: list[int], rank: int = 0) -> None:
        self.cfg = cfg
        self.rank = rank
        self.metrics = metrics
        self.kv = KVCache(
            num_blocks=cfg.num_gpu_blocks,
            block_size=cfg.block_size,
            emit=self._emit,
            hash_seed=cfg.hash_seed,
            hash_format=cfg.block_hash_format,
            enable_prefix_caching=cfg.enable_prefix_caching,
        )
        self.running: list[SimRequest] = []
        self.waiting: deque[SimRequest] = deque()
        self.loras = {name: LoraRef(name, path, i + 1) for i, (name, path) in enumerate(cfg.lora_paths().items())}
        self._on_events: list[Callable[[list[KVEvent]], None]] = []
        self._output_ids = output_ids or [0]
        self.prefilling = 0  # requests computing their prefill right now (they slow this engine's decodes)
        self._prefill_lock = asyncio.Lock()  # FIFO: the shared prefill of prefill_tokens_per_second mode
        self._chunk_tokens = 0  # chunked prefill: prefill tokens in each step of the prefill being computed
        self._prefill_queue = 0  # requests waiting for or computing the shared prefill (not decoding yet)
        self._next_block_id = 0

    # --- events -----------------------------------------------------------------------------------------
    def _emit(self, events: list[KVEvent]) -> None:
        for cb in self._on_events:
            cb(events)

    def on_events(self, cb: Callable[[list[KVEvent]], None]) -> None:
        self._on_events.append(cb)

    # --- admission --------------------------------------------------------------------------------------
    def lora_for(self, model: str) -> LoraRef | None:
        """None for the base model; EngineError(404) for an unknown model name."""
        if model in ("", self.cfg.model_name, self.cfg.model):
            return None
        if model in self.loras:
            return self.loras[model]
        raise EngineError(404, f"The model `{model}` does not exist.", "NotFoundError")

    def running_loras(self) -> list[str]:
        return sorted({r.lora.name for r in self.running if r.lora})

    def waiting_loras(self) -> list[str]:
        return sorted({r.lora.name for r in self.waiting if r.lora})

    def _can_run(self, req: SimRequest) -> bool:
        if len(self.running) >= self.cfg.max_num_seqs:
            return False
        if req.lora is not None:
            active = set(self.running_loras())
            if req.lora.name not in active and len(active) >= self.cfg.max_loras:
                return False
        try:
            req.alloc = self.kv.allocate(req.hashes, len(req.prompt_ids), len(req.prompt_ids) + req.max_tokens)
            req.alloc.mm = tuple(req.mm)
        except NoSpace:
            return False
        req.cached_tokens = req.alloc.hit_blocks * self.cfg.block_size
        return True

    def schedule(self) -> None:
        """FIFO, but a waiting request that cannot run (LoRA slots, space) does not block the ones behind it."""
        for req in list(self.waiting):
            if len(self.running) >= self.cfg.max_num_seqs:
                break
            if self._can_run(req):
                self.waiting.remove(req)
                self.running.append(req)
                assert req.admitted is not None
                if not req.admitted.done():
                    req.admitted.set_result(None)

    def load_factor(self) -> float:
        n, cap = len(self.running), self.cfg.max_num_seqs
        if cap <= 1 or n <= 1:
            return 1.0 if n < cap else self.cfg.time_factor_under_load
        return 1.0 + (self.cfg.time_factor_under_load - 1.0) * (min(n, cap) - 1) / (cap - 1)

    def _hit(self, req: SimRequest, queued: float) -> int:
        """The request's cache hit, final now that its prefill starts; returns the tokens left to compute."""
        self.metrics.on_admit(len(req.prompt_ids), req.cached_tokens, queued)
        return len(req.prompt_ids) - req.cached_tokens

    async def _prefill(self, req: SimRequest, queued: float) -> None:
        cfg = self.cfg
        if cfg.prefill_tokens_per_second > 0:
            self._prefill_queue += 1
            try:
                async with self._prefill_lock:  # waiting for the lock is not computing: no interference
                    # the prefills ahead of this one may have computed part of its prompt: it is looked up again
                    assert req.alloc is not None
                    self.kv.extend_hit(req.alloc, len(req.prompt_ids))
                    req.cached_tokens = req.alloc.hit_blocks * cfg.block_size
                    uncached = self._hit(req, queued)
                    t = cfg.prefill_overhead + uncached / cfg.prefill_tokens_per_second
                    budget = cfg.max_num_batched_tokens
                    if budget > 0:
                        self._chunk_tokens = min(budget, uncached)
                        if len(self.running) > self._prefill_queue:  # each step also computes the decodes' tokens
                            t += -(-uncached // budget) * cfg.inter_token_latency * self.load_factor()
                    self.prefilling += 1
                    try:
                        await asyncio.sleep(t * cfg.time_scale)
                    finally:
                        self.prefilling -= 1
                        self._chunk_tokens = 0
            finally:
                self._prefill_queue -= 1
            return
        uncached = self._hit(req, queued)
        t = (cfg.prefill_overhead + uncached * cfg.prefill_time_per_token) * self.load_factor()
        self.prefilling += 1
        try:
            await asyncio.sleep(t * cfg.time_scale)
        finally:
            self.prefilling -= 1

    # --- one request ------------------------------------------------------------------------------------
    def check(self, req: SimRequest) -> None:
        n = len(req.prompt_ids)
        if n == 0:
            raise EngineError(400, "The prompt is empty.")
        if n + req.max_tokens > self.cfg.max_model_len:
            raise EngineError(
                400,
                f"This model's maximum context length is {self.cfg.max_model_len} tokens. However, you requested "
                f"{n + req.max_tokens} tokens ({n} in the messages, {req.max_tokens} in the completion).",
            )
        if self.kv.blocks_for(n + req.max_tokens) > self.cfg.num_gpu_blocks:
            raise EngineError(
                400, f"The request needs more KV-cache blocks than the {self.cfg.num_gpu_blocks} there are."
            )
        if len(self.waiting) >= self.cfg.max_waiting_queue_length:
            raise EngineError(429, "The waiting queue is full.", "TooManyRequests")

    async def generate(self, req: SimRequest) -> AsyncGenerator[Token, None]:
        """Queue, prefill, then yield output tokens in real time. Cancellation (client gone) frees the slot."""
        self.check(req)
        if len(req.prompt_ids) > HASH_THREAD_THRESHOLD_TOKENS:  # ~10 us per block: keep long prompts off the loop
            req.hashes = await asyncio.to_thread(self.kv.block_hashes, req.prompt_ids, req.lora, req.cache_salt, req.mm)
        else:
            req.hashes = self.kv.block_hashes(req.prompt_ids, req.lora, req.cache_salt, req.mm)
        req.admitted = asyncio.get_running_loop().create_future()
        self.waiting.append(req)
        self.schedule()
        try:
            await req.admitted
            queued = time.monotonic() - req.arrival
            if req.remote_blocks is not None:
                self.metrics.on_admit(len(req.prompt_ids), req.cached_tokens, queued)
                await self._pull_remote_kv(req, len(req.prompt_ids) - req.cached_tokens)
            else:
                await self._prefill(req, queued)
            if req.remote_decode:
                self.metrics.on_remote_decode()
            assert req.alloc is not None
            self.kv.register(req.alloc, req.prompt_ids, req.lora, req.cache_salt)
            req.block_ids = self._block_ids(self.kv.blocks_for(len(req.prompt_ids)))
            self.metrics.on_first_token(time.monotonic() - req.arrival)
            last = time.monotonic()
            all_ids = list(req.prompt_ids)
            for i in range(req.max_tokens):
                if i:
                    await asyncio.sleep(self.inter_token_latency() * self.cfg.time_scale)
                    now = time.monotonic()
                    self.metrics.on_token(now - last)
                    last = now
                    # this step computed the previous token's KV; a block it completed becomes cacheable
                    if len(all_ids) % self.cfg.block_size == 0:
                        self.kv.extend(req.alloc, all_ids, req.lora, req.cache_salt)
                token = self._output_ids[i % len(self._output_ids)]
                all_ids.append(token)
                yield Token(i, token, i == 0)
            self.metrics.on_finish(time.monotonic() - req.arrival, req.max_tokens, "length")
        finally:
            if req in self.waiting:
                self.waiting.remove(req)
            if req in self.running:
                self.running.remove(req)
            if req.alloc is not None:
                self.kv.release(req.alloc)
            self.schedule()

    def inter_token_latency(self) -> float:
        """A decode step: slower under load, and slower while prefills share the engine (chunked prefill)."""
        cfg = self.cfg
        interference = 1.0 + cfg.prefill_interference * self.prefilling
        step = cfg.inter_token_latency * self.load_factor() * interference
        if self._chunk_tokens and cfg.prefill_tokens_per_second > 0:
            step += self._chunk_tokens / cfg.prefill_tokens_per_second
        return step

    async def _pull_remote_kv(self, req: SimRequest, uncached: int) -> None:
        """P/D decode: the prompt's uncached blocks come from the prefiller (a transfer, no compute); tokens the
        prefiller did not send (fewer blocks than needed) are computed here."""
        assert req.remote_blocks is not None
        bs = self.cfg.block_size
        needed = -(-uncached // bs)
        pulled = min(needed, len(req.remote_blocks))
        missing = max(0, uncached - pulled * bs)
        delay = self.cfg.kv_transfer_overhead + pulled * self.cfg.kv_transfer_time_per_block
        self.metrics.on_remote_prefill(pulled)
        if missing:
            self.prefilling += 1
            delay += missing * self.cfg.prefill_time_per_token * self.load_factor()
        try:
            await asyncio.sleep(delay * self.cfg.time_scale)
        finally:
            if missing:
                self.prefilling -= 1

    def _block_ids(self, n: int) -> list[int]:
        """Block ids for kv_transfer_params (the simulator has no physical ids: a fresh range per request)."""
        start = self._next_block_id
        self._next_block_id = (start + n) % (1 << 31)
        return list(range(start, start + n))

    def load(self) -> int:
        """vLLM's DP balancing score: 4 x waiting + running."""
        return 4 * len(self.waiting) + len(self.running)

    def reset_prefix_cache(self) -> bool:
        return self.kv.reset()
