"""Simulator settings: one dataclass, filled from command-line flags (names follow vLLM / llm-d-inference-sim)."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field

from epp.tokenization.qwen import QWEN25_MODEL


@dataclass
class SimConfig:
    model: str = QWEN25_MODEL
    served_model_name: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    pod_name: str = ""
    pod_ip: str = "127.0.0.1"
    # Engine
    max_num_seqs: int = 5
    max_waiting_queue_length: int = 1000
    max_model_len: int = 32768
    default_max_tokens: int = 16
    data_parallel_rank: int = 0  # rank of the first engine; rank r publishes on the endpoint's port + r
    data_parallel_size: int = 1  # engines behind this one HTTP server (vLLM's internal DP load balancing)
    # KV cache
    block_size: int = 16
    num_gpu_blocks: int = 1024
    enable_prefix_caching: bool = True
    lora_modules: list[str] = field(default_factory=list)
    max_loras: int = 1
    # KV events
    kv_events_endpoint: str | None = None  # tcp://*:PORT binds, tcp://host:PORT connects
    kv_events_replay_endpoint: str | None = None
    kv_events_bind: bool = False  # bind the PUB even without `*` (one IP per simulator on 127.0.0.0/8)
    # count subscribers' connections to a bound PUB (a socket monitor; /admin/state publishers[i].subscribers)
    kv_events_count_subscribers: bool = False
    kv_events_topic: str | None = None  # default kv@<pod_ip>:<port>@<model>
    kv_events_encoding: str = "array"  # "array" (msgspec array_like, older vLLM) | "map" (tagged maps, vLLM #42892)
    kv_events_buffer_steps: int = 10_000
    kv_events_hwm: int = 100_000
    block_hash_format: str = "int"  # "int" (low 64 bits, VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1) | "bytes"
    hash_seed: str | None = None  # default: $PYTHONHASHSEED, else vLLM's "vllm-none-hash"
    # Latency model (seconds)
    prefill_overhead: float = 0.010
    prefill_time_per_token: float = 0.0002
    inter_token_latency: float = 0.002
    time_factor_under_load: float = 1.0
    # > 0: prefill is a shared per-engine resource (chunked prefill, FCFS): uncached prompt tokens are
    # processed at this many tokens/s, one prefill after the other; 0: each request's prefill takes
    # prefill_overhead + uncached x prefill_time_per_token on its own (the original model).
    prefill_tokens_per_second: float = 0.0
    # With prefill_tokens_per_second: vLLM's per-step token budget (chunked prefill); 0 = one unchunked prefill.
    max_num_batched_tokens: int = 0
    time_scale: float = 1.0  # every modelled duration is multiplied by this (0.1 = ten times faster)
    # P/D disaggregation (llm-d roles; vLLM's NIXL connector: kv_transfer_params)
    role: str = "both"  # llm-d.ai/role of this pod: prefill | decode | both | encode (every pod serves everything)
    kv_transfer_overhead: float = 0.002  # seconds per remote-prefilled request (the NIXL handshake and read)
    kv_transfer_time_per_block: float = 0.0001  # seconds per pulled block
    prefill_interference: float = 0.0  # ITL x (1 + this x prefills running on the same engine)
    # E/P/D (e2e/sim/encode.py): the multimodal encoder stage
    encode_time_per_item: float = 0.02  # seconds to encode one multimodal item not cached here
    ec_transfer_time_per_item: float = 0.001  # seconds to load one from an encoder or the shared storage
    ec_shared_storage_path: str = ""  # vLLM's ECExampleConnector directory (encode pods write, every pod reads)
    # A Qwen2.5-VL-like model (e2e/sim/multimodal.py): chat renders images (placeholders, mm hashes in the blocks)
    multimodal: bool = False
    # Metrics
    legacy_gpu_cache_metric: bool = False
    # Failure injection
    failure_rate: float = 0.0  # 0..1, fraction of generation requests answered with an error
    failure_status: int = 500
    omit_kv_transfer_params: bool = False  # a prefill for a remote decode answers without kv_transfer_params
    startup_delay: float = 0.0  # /health answers 503 (and requests 503) this long after start
    crash_after: float = 0.0  # > 0: the process exits with code 1 this many seconds after start
    kv_events_drop_rate: float = 0.0  # 0..1: share of KV events silently lost before numbering (no seq gap)
    kv_events_drop_types: list[str] = field(default_factory=list)  # only these event types (default: all)
    kv_events_mode: str = "on"  # initial publisher mode: on | off (drop events) | lossy (buffer, do not send)
    prompt_tokens_details: bool = True  # usage.prompt_tokens_details.cached_tokens (vLLM needs a flag for it)
    seed: int = 0

    @property
    def ranks(self) -> list[int]:
        return [self.data_parallel_rank + i for i in range(self.data_parallel_size)]

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model

    @property
    def topic(self) -> str:
        return self.kv_events_topic or f"kv@{self.pod_ip}:{self.port}@{self.model_name}"

    @property
    def pod(self) -> str:
        return self.pod_name or os.environ.get("POD_NAME", "") or f"sim-{self.port}"

    def lora_paths(self) -> dict[str, str]:
        """LoRA adapters as name → path (`name=path` or a bare `name`, whose path is `/loras/<name>`)."""
        out: dict[str, str] = {}
        for item in self.lora_modules:
            name, _, path = item.partition("=")
            out[name] = path or f"/loras/{name}"
        return out


def build_parser() -> argparse.ArgumentParser:
    """The simulator's flags (also listed by `python -m e2e.sim.launch --help`)."""
    d = SimConfig()
    p = argparse.ArgumentParser(prog="python -m e2e.sim", description="vLLM-compatible model-server simulator")
    a = p.add_argument
    a("--model", default=d.model)
    a("--served-model-name", default=None)
    a("--host", default=d.host)
    a("--port", type=int, default=d.port, help="HTTP port (0 = pick a free one; printed on stdout)")
    a("--pod-name", default="")
    a("--pod-ip", default=os.environ.get("POD_IP", d.pod_ip))
    a("--max-num-seqs", type=int, default=d.max_num_seqs)
    a("--max-waiting-queue-length", type=int, default=d.max_waiting_queue_length)
    a("--max-model-len", type=int, default=d.max_model_len)
    a("--default-max-tokens", type=int, default=d.default_max_tokens)
    a("--data-parallel-rank", type=int, default=d.data_parallel_rank, help="offsets the event ports like vLLM")
    a("--data-parallel-size", type=int, default=d.data_parallel_size, help="engines (ranks) behind this server")
    a("--block-size", type=int, default=d.block_size)
    a("--num-gpu-blocks", "--kv-cache-size", type=int, default=d.num_gpu_blocks)
    a("--no-enable-prefix-caching", dest="enable_prefix_caching", action="store_false")
    a("--lora-modules", nargs="*", default=[], help="adapter names (name or name=path)")
    a("--max-loras", type=int, default=d.max_loras)
    a("--kv-events-endpoint", default=None, help="ZMQ PUB endpoint, e.g. tcp://*:5557 (bind) or tcp://host:5557")
    a("--kv-events-replay-endpoint", default=None, help="ZMQ ROUTER replay endpoint, e.g. tcp://*:5558")
    a("--kv-events-bind", action="store_true", help="bind the PUB even if the endpoint has no `*`")
    a(
        "--kv-events-count-subscribers",
        action="store_true",
        help="count the subscribers connected to a bound PUB (a socket monitor), shown in /admin/state",
    )
    a("--kv-events-topic", default=None)
    a("--kv-events-encoding", choices=["array", "map"], default=d.kv_events_encoding)
    a("--kv-events-buffer-steps", type=int, default=d.kv_events_buffer_steps)
    a("--kv-events-hwm", type=int, default=d.kv_events_hwm)
    a("--block-hash-format", choices=["int", "bytes"], default=d.block_hash_format)
    a("--hash-seed", default=None)
    a("--prefill-overhead", type=float, default=d.prefill_overhead, help="seconds")
    a("--prefill-time-per-token", type=float, default=d.prefill_time_per_token, help="seconds per uncached token")
    a("--inter-token-latency", type=float, default=d.inter_token_latency, help="seconds per output token")
    a("--time-factor-under-load", type=float, default=d.time_factor_under_load)
    a(
        "--prefill-tokens-per-second",
        type=float,
        default=d.prefill_tokens_per_second,
        help="> 0: shared FCFS prefill at this many uncached tokens/s per engine (0 = per-request prefill time)",
    )
    a("--max-num-batched-tokens", type=int, default=d.max_num_batched_tokens, help="chunked prefill step budget")
    a("--time-scale", type=float, default=d.time_scale, help="multiplies every modelled duration")
    a("--role", choices=["prefill", "decode", "both", "encode"], default=d.role, help="llm-d.ai/role (P/D, E/P/D)")
    a("--kv-transfer-overhead", type=float, default=d.kv_transfer_overhead, help="seconds per remote prefill")
    a("--kv-transfer-time-per-block", type=float, default=d.kv_transfer_time_per_block, help="seconds per block")
    a("--prefill-interference", type=float, default=d.prefill_interference, help="ITL slowdown per prefill")
    a("--encode-time-per-item", type=float, default=d.encode_time_per_item, help="seconds per multimodal item")
    a("--ec-transfer-time-per-item", type=float, default=d.ec_transfer_time_per_item, help="seconds per item")
    a("--ec-shared-storage-path", default=d.ec_shared_storage_path, help="ECExampleConnector shared directory")
    a("--multimodal", action="store_true", help="a Qwen2.5-VL-like model: chat prompts render image parts")
    a("--legacy-gpu-cache-metric", action="store_true", help="also export vllm:gpu_cache_usage_perc")
    a("--failure-rate", type=float, default=d.failure_rate, help="0..1")
    a("--failure-status", type=int, default=d.failure_status)
    a("--startup-delay", type=float, default=d.startup_delay, help="seconds of 503 after start")
    a("--crash-after", type=float, default=d.crash_after, help="seconds until the process exits with code 1")
    a("--kv-events-drop-rate", type=float, default=d.kv_events_drop_rate, help="0..1, events silently lost")
    a(
        "--kv-events-drop-types",
        nargs="*",
        default=[],
        choices=["BlockStored", "BlockRemoved", "AllBlocksCleared"],
        help="lose only these event types (BlockRemoved: evictions the engine never announces)",
    )
    a("--kv-events-mode", choices=["on", "off", "lossy"], default=d.kv_events_mode)
    a(
        "--no-prompt-tokens-details", dest="prompt_tokens_details", action="store_false",
        help="usage without prompt_tokens_details.cached_tokens (vLLM without --enable-prompt-tokens-details)",
    )  # fmt: skip
    a("--seed", type=int, default=d.seed)
    return p


def parse_args(argv: list[str] | None = None) -> SimConfig:
    p = build_parser()
    ns = p.parse_args(argv)
    cfg = SimConfig(**{k: v for k, v in vars(ns).items()})
    if cfg.time_factor_under_load < 1.0:
        p.error("--time-factor-under-load must be >= 1.0")
    if cfg.prefill_tokens_per_second < 0 or cfg.time_scale <= 0:
        p.error("--prefill-tokens-per-second must be >= 0 and --time-scale > 0")
    if cfg.max_num_batched_tokens < 0:
        p.error("--max-num-batched-tokens must be >= 0")
    if cfg.data_parallel_size < 1:
        p.error("--data-parallel-size must be >= 1")
    if cfg.block_size <= 0 or cfg.num_gpu_blocks <= 0:
        p.error("--block-size and --num-gpu-blocks must be positive")
    return cfg
