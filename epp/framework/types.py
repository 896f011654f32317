"""Data types shared by the scheduler, the data layer and every plugin."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from epp.framework.state import DataMap


class ApiKind(StrEnum):
    """The API a request speaks, as its parser read it (a str: logs and labels show the plain name)."""

    CHAT = "chat"  # OpenAI chat completions
    COMPLETIONS = "completions"
    RESPONSES = "responses"
    CONVERSATIONS = "conversations"
    EMBEDDINGS = "embeddings"
    IMAGES = "images"  # OpenAI image generations
    MESSAGES = "messages"  # Anthropic Messages
    COUNT_TOKENS = "count_tokens"  # Anthropic count_tokens
    GENERATE = "generate"  # vLLM/SGLang native generate (HTTP or gRPC)
    PASSTHROUGH = "passthrough"  # an opaque body routed without reading it
    OTHER = "other"  # a request without a body (headers-only pick)


def join_host_port(host: str, port: int) -> str:
    """`ip:port`, with brackets for IPv6 (Go's net.JoinHostPort)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(slots=True)
class Metrics:
    """A model server's scraped state (vLLM names in comments). `update_time` is time.monotonic()."""

    waiting_queue_size: int = 0  # vllm:num_requests_waiting
    running_requests_size: int = 0  # vllm:num_requests_running
    kv_cache_usage_percent: float = 0.0  # vllm:kv_cache_usage_perc, 0..1
    active_models: frozenset[str] = frozenset()  # vllm:lora_requests_info running_lora_adapters
    waiting_models: frozenset[str] = frozenset()  # ... waiting_lora_adapters
    max_active_models: int = 0  # ... max_lora
    cache_block_size: int = 0  # vllm:cache_config_info{block_size}
    cache_num_blocks: int = 0  # vllm:cache_config_info{num_gpu_blocks}
    # The engine's prefix-cache counters (tokens looked up / found cached since it started), None when the page has
    # none: vllm:prefix_cache_queries_total / vllm:prefix_cache_hits_total (SGLang: prompt / cached tokens).
    prefix_cache_queries: float | None = None
    prefix_cache_hits: float | None = None
    update_time: float = 0.0

    @property
    def kv_capacity_tokens(self) -> int:
        """The engine's KV cache in tokens (GPU blocks x block size); 0 while its cache config is unscraped."""
        return self.cache_num_blocks * self.cache_block_size

    def age(self, now: float | None = None) -> float:
        """Seconds since the last successful scrape (infinite if never scraped)."""
        if self.update_time == 0.0:
            return float("inf")
        return (time.monotonic() if now is None else now) - self.update_time


@dataclass(slots=True)
class EndpointHealth:
    """What the EPP observed of an endpoint's liveness: written by the metrics scraper and by routed responses'
    status, judged by `epp.datalayer.health` when candidates are chosen. Times are time.monotonic()."""

    scrape_failures: int = 0  # consecutive failed scrapes (connection refused, timeout, 5xx, bad page)
    last_ok: float = 0.0  # the last good scrape; 0.0 = no scraper has succeeded yet (never judged stale)
    server_errors: int = 0  # consecutive 5xx answers (the model server's or Envoy's upstream errors)
    ejected_until: float = 0.0  # after too many consecutive 5xx: not a candidate until then


@dataclass(slots=True, eq=False)
class Endpoint:
    """One schedulable target: a (pod, port) pair. `name` is `<pod>-rank-<i>` for Kubernetes pods."""

    name: str
    address: str
    port: int
    namespace: str = "default"
    labels: dict[str, str] = field(default_factory=dict)
    metrics: Metrics = field(default_factory=Metrics)
    metrics_port: int | None = None
    pod_name: str = ""
    # Per-endpoint data owned by plugins and data sources (e.g. the KV-event endpoint), by typed key.
    attributes: DataMap = field(default_factory=DataMap)
    hostport: str = ""
    node_address: str = ""  # the node's IP (pod status.hostIP), for per-node exporters (dcgm-data-source)
    health: EndpointHealth = field(default_factory=EndpointHealth)
    metrics_address: str = ""  # where its metrics are, when not at `address` (a hub's cluster: its EPP's host)

    def __post_init__(self) -> None:
        self.hostport = join_host_port(self.address, self.port)
        if not self.pod_name:
            self.pod_name = self.name

    @property
    def metrics_hostport(self) -> str:
        return join_host_port(self.metrics_address or self.address, self.metrics_port or self.port)


@dataclass(slots=True)
class MultiModalFeature:
    """One multimodal item of a prompt: its content hash (vLLM's mm hash) and the placeholder tokens it fills."""

    modality: str  # "image" | "audio" | "video"
    hash: str
    offset: int = 0  # first placeholder token
    length: int = 0  # number of placeholder tokens


@dataclass(slots=True)
class InferenceRequest:
    """One parsed LLM request, as the scheduler and plugins see it."""

    request_id: str
    path: str
    api: ApiKind
    model: str  # as sent by the client
    target_model: str  # after rewrites; what the model server receives
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)  # lower-cased names
    prompt: str | list[Any] | None = None
    messages: list[dict[str, Any]] | None = None  # OpenAI chat form (Anthropic/Responses converted as vLLM does)
    tools: list[dict[str, Any]] | None = None  # OpenAI chat tools, for the chat template
    chat_template_kwargs: dict[str, Any] | None = None
    token_ids: list[int] | None = None  # pre-tokenized input (/inference/v1/generate, SGLang, gRPC): no tokenizing
    mm_features: list[MultiModalFeature] | None = None  # multimodal items of pre-tokenized input
    cache_salt: str | None = None
    stream: bool = False
    max_tokens: int | None = None
    body_size: int = 0
    objective: str | None = None
    priority: int = 0
    fairness_id: str = "default-flow"
    subset: list[str] | None = None  # envoy.lb.subset_hint, when present
    arrival: float = field(default_factory=time.monotonic)
    # Typed data plugins exchange about this request (token ids, prefix matches...); see epp.framework.keys.
    data: DataMap = field(default_factory=DataMap)

    @property
    def sheddable(self) -> bool:
        return self.priority < 0


@dataclass(slots=True)
class ProfileResult:
    """The endpoints a profile's picker chose, best first (the rest are fallbacks)."""

    targets: list[Endpoint]
    scores: dict[str, float] = field(default_factory=dict)  # endpoint name -> weighted score
    # Every endpoint the profile scored (after its filters) with its weighted total: the anchor's ScoredCandidates
    # (filled by the profile, not the picker; read for --emit-endpoint-scores).
    candidates: list[tuple[Endpoint, float]] = field(default_factory=list)


@dataclass(slots=True)
class SchedulingResult:
    profile_results: dict[str, ProfileResult]
    primary_profile: str

    @property
    def targets(self) -> list[Endpoint]:
        primary = self.profile_results.get(self.primary_profile)
        return primary.targets if primary else []


@dataclass(slots=True)
class Usage:
    """Token usage read from a model server's response."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cached_tokens: int = 0
    # Whether the server reported `cached_tokens` at all (vLLM only with --enable-prompt-tokens-details): a 0
    # that was never reported must not read as "no cache hit".
    cached_tokens_reported: bool = False


@dataclass(slots=True)
class PrefixCacheMatchInfo:
    """How much of this request's prompt each endpoint already caches (written by a prefix producer).

    `matches` maps endpoint name → matched (possibly tier-weighted) blocks; absent means 0.
    """

    total_blocks: int
    block_size_tokens: int
    matches: dict[str, float] = field(default_factory=dict)


@dataclass(slots=True)
class TokenizedPrompt:
    """The prompt as the model server will see it: token ids after the chat template (multimodal placeholders
    expanded), and its multimodal items (vLLM's mm hash and placeholder range each), sorted by offset."""

    token_ids: list[int]
    mm_features: list[MultiModalFeature] | None = None


@dataclass(slots=True)
class PrefixMatch:
    """A pod's consecutive cached prefix from block 0: block count and tier-weighted block sum."""

    blocks: int
    weighted: float


@dataclass(slots=True)
class InFlightLoad:
    """An endpoint's in-flight load as the EPP counts it (inflight-load-producer): requests and tokens from pick to
    response end. `remote_*` is what the other EPP replicas report for it (a cross-replica syncer fills them)."""

    requests: int = 0
    tokens: int = 0
    remote_requests: int = 0
    remote_tokens: int = 0

    @property
    def total_requests(self) -> int:
        return self.requests + self.remote_requests

    @property
    def total_tokens(self) -> int:
        return self.tokens + self.remote_tokens


@dataclass(slots=True)
class ResponseChunk:
    """One response body chunk as ResponseStreaming hooks see it. `first`: the first body chunk (for a streamed
    response, prefill is done); `end`: the last one. `time` is time.monotonic() at arrival."""

    data: bytes
    first: bool
    end: bool
    time: float


@dataclass(slots=True)
class Response:
    """The model server's response as ResponseReceived hooks see it; `set_headers` go back to the client."""

    status: int
    headers: dict[str, str] = field(default_factory=dict)  # lower-cased names, as received
    set_headers: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class DisaggDecision:
    """Which pods serve one request's stages (written by a disaggregation profile handler, per request).

    `decode` serves the request; `prefill` (P/D) computes the prompt's KV cache and hands it to `decode`;
    `encode` (E/P/D) compute multimodal embeddings. PreRequest turns them into the sidecar's headers.
    """

    decode: Endpoint
    prefill: Endpoint | None = None
    encode: list[Endpoint] = field(default_factory=list)
    prefill_profile: str = "prefill"
    encode_profile: str = "encode"


@dataclass(slots=True)
class LatencyPrediction:
    """One endpoint's predicted latency for this request (llm-d's LatencyPredictionInfo), in milliseconds.

    Headroom = SLO - predicted (negative: the SLO would be missed); without an SLO it is -predicted, and the
    valid flags are those of a zero SLO. `dispatched` is the requests this EPP has in flight on the endpoint.
    """

    ttft_ms: float
    tpot_ms: float
    ttft_valid: bool
    tpot_valid: bool
    ttft_headroom: float
    tpot_headroom: float
    dispatched: int = 0

    @property
    def valid(self) -> bool:
        return self.ttft_valid and self.tpot_valid


@dataclass(slots=True)
class LatencyPredictionInfo:
    """Per endpoint name: the latency predictions a predicted-latency producer made for this request.

    `predictions` is empty when the model is cold or unfit (consumers then fall back to their non-latency
    behaviour); `has_slo` says whether the request carried an SLO header.
    """

    predictions: dict[str, LatencyPrediction] = field(default_factory=dict)
    has_slo: bool = False
