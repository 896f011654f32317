"""Prometheus metrics under vLLM's names and labels (`model_name`, `engine`), in a registry of our own.

Gauges that mirror engine state (running, waiting, KV usage, LoRA info) are refreshed at scrape time.
`vllm:lora_requests_info` is a gauge whose value is the time of the update, with one series per label
combination kept forever, as vLLM does; readers (GIE) take the series with the largest value.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 1.0)
E2E_BUCKETS = (0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0)


class SimMetrics:
    def __init__(
        self,
        *,
        model_name: str,
        block_size: int,
        num_gpu_blocks: int,
        max_loras: int,
        enable_prefix_caching: bool,
        legacy_gpu_cache_metric: bool = False,
        ranks: tuple[int, ...] = (0,),
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        names = ["model_name", "engine"]
        r = self.registry
        self.running = Gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches.", names, registry=r
        )
        self.waiting = Gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed.", names, registry=r
        )
        self.kv_usage = Gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", names, registry=r
        )
        self.gpu_usage = (
            Gauge("vllm:gpu_cache_usage_perc", "GPU KV-cache usage (deprecated name).", names, registry=r)
            if legacy_gpu_cache_metric
            else None
        )
        self.prefix_queries = Counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            names,
            registry=r,
        )
        self.prefix_hits = Counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", names, registry=r
        )
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", names, registry=r)
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "Number of generation tokens processed.", names, registry=r
        )
        self.success = Counter(
            "vllm:request_success", "Count of successfully processed requests.", [*names, "finished_reason"], registry=r
        )
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", names,
            buckets=TTFT_BUCKETS, registry=r,
        )  # fmt: skip
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", names,
            buckets=ITL_BUCKETS, registry=r,
        )  # fmt: skip
        self.tpot = Histogram(
            "vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds (deprecated).", names,
            buckets=ITL_BUCKETS, registry=r,
        )  # fmt: skip
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.", names,
            buckets=E2E_BUCKETS, registry=r,
        )  # fmt: skip
        self.queue_time = Histogram(
            "vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", names,
            buckets=E2E_BUCKETS, registry=r,
        )  # fmt: skip
        # P/D (the simulator's own names): prefills done for a remote decoder, decodes whose KV came from remote.
        self.remote_decode = Counter(
            "sim:remote_decode_requests", "Prefills done for a remote decode (do_remote_decode).", names, registry=r
        )
        self.remote_prefill = Counter(
            "sim:remote_prefill_requests", "Decodes whose prompt KV was pulled from a prefiller.", names, registry=r
        )
        self.kv_transfer_blocks = Counter(
            "sim:kv_transfer_blocks", "KV blocks pulled from prefillers.", names, registry=r
        )
        self.lora_info = Gauge(
            "vllm:lora_requests_info", "Running stats on lora requests.",
            ["max_lora", "waiting_lora_adapters", "running_lora_adapters"], registry=r,
        )  # fmt: skip
        self.cache_info = Gauge(
            "vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
            ["block_size", "num_gpu_blocks", "num_cpu_blocks", "enable_prefix_caching", "cache_dtype", "engine"],
            registry=r,
        )  # fmt: skip
        self._cache_config = (block_size, enable_prefix_caching, tuple(ranks))
        self.set_num_gpu_blocks(num_gpu_blocks)
        self.max_loras = max_loras
        self._lora_state: tuple[str, str] | None = None
        self._state: Callable[[], EngineStates] | None = None
        self.model_name = model_name

    def set_num_gpu_blocks(self, num_gpu_blocks: int) -> None:
        """(Re)publish vllm:cache_config_info: the KV capacity can change at run time (/admin/config)."""
        block_size, enable_prefix_caching, ranks = self._cache_config
        self.cache_info.clear()
        for rank in ranks:
            self.cache_info.labels(
                block_size=str(block_size), num_gpu_blocks=str(num_gpu_blocks), num_cpu_blocks="0",
                enable_prefix_caching=str(enable_prefix_caching), cache_dtype="auto", engine=str(rank),
            ).set(1)  # fmt: skip

    def engine(self, rank: int) -> EngineMetrics:
        """The recording side for one data-parallel engine (series labelled engine=<rank>)."""
        return EngineMetrics(self, {"model_name": self.model_name, "engine": str(rank)})

    def bind(self, state: Callable[[], EngineStates]) -> None:
        """`state()` → ([(rank, running, waiting, kv usage 0..1)], running LoRAs, waiting LoRAs), read per scrape."""
        self._state = state

    def refresh(self) -> None:
        if self._state is None:
            return
        engines, run_loras, wait_loras = self._state()
        for rank, running, waiting, usage in engines:
            labels = {"model_name": self.model_name, "engine": str(rank)}
            self.running.labels(**labels).set(running)
            self.waiting.labels(**labels).set(waiting)
            self.kv_usage.labels(**labels).set(usage)
            if self.gpu_usage is not None:
                self.gpu_usage.labels(**labels).set(usage)
        lora = (",".join(run_loras), ",".join(wait_loras))
        if lora != self._lora_state or self._lora_state is None:
            self._lora_state = lora
            self.lora_info.labels(
                max_lora=str(self.max_loras), running_lora_adapters=lora[0], waiting_lora_adapters=lora[1]
            ).set(time.time())

    def render(self) -> bytes:
        self.refresh()
        return generate_latest(_WithoutCreated(self.registry))  # type: ignore[arg-type,unused-ignore]


EngineStates = tuple[list[tuple[int, int, int, float]], list[str], list[str]]


class EngineMetrics:
    def __init__(self, m: SimMetrics, labels: dict[str, str]) -> None:
        self.m = m
        self.labels = labels

    def on_admit(self, prompt_tokens: int, cached_tokens: int, queued_s: float) -> None:
        self.m.prefix_queries.labels(**self.labels).inc(prompt_tokens)
        self.m.prefix_hits.labels(**self.labels).inc(cached_tokens)
        self.m.prompt_tokens.labels(**self.labels).inc(prompt_tokens)
        self.m.queue_time.labels(**self.labels).observe(queued_s)

    def on_first_token(self, ttft_s: float) -> None:
        self.m.ttft.labels(**self.labels).observe(ttft_s)
        self.m.generation_tokens.labels(**self.labels).inc()

    def on_token(self, itl_s: float) -> None:
        self.m.itl.labels(**self.labels).observe(itl_s)
        self.m.tpot.labels(**self.labels).observe(itl_s)
        self.m.generation_tokens.labels(**self.labels).inc()

    def on_remote_decode(self) -> None:
        self.m.remote_decode.labels(**self.labels).inc()

    def on_remote_prefill(self, blocks: int) -> None:
        self.m.remote_prefill.labels(**self.labels).inc()
        self.m.kv_transfer_blocks.labels(**self.labels).inc(blocks)

    def on_finish(self, e2e_s: float, output_tokens: int, reason: str) -> None:
        self.m.e2e.labels(**self.labels).observe(e2e_s)
        self.m.success.labels(**self.labels, finished_reason=reason).inc()


class _WithoutCreated:
    """vLLM exports no `*_created` series; drop them per registry (not process-wide like disable_created_metrics)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def collect(self) -> Iterator[Metric]:
        for fam in self.registry.collect():
            fam.samples = [s for s in fam.samples if not s.name.endswith("_created")]
            yield fam
