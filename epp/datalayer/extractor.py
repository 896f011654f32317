"""Maps a model server's metrics page to an Endpoint's Metrics, per engine (GIE's core-metrics-extractor).

The engine comes from the pod label `inference.networking.k8s.io/engine-type` (default vllm). A spec is a PromQL
selector `name{label="value"}`; "" disables a metric. The KV-usage spec may list alternatives separated by `|`
(vLLM renamed gpu_cache_usage_perc to kv_cache_usage_perc in v1).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass

from epp.datalayer.promtext import Sample, find_family, parse_labels
from epp.framework import Endpoint, Metrics
from epp.framework.verbosity import DEFAULT, V

log = logging.getLogger(__name__)

ENGINE_LABEL = "inference.networking.k8s.io/engine-type"
_SPEC_RE = re.compile(r"^\s*([A-Za-z_:][A-Za-z0-9_:]*)\s*(?:\{(.*)\})?\s*$")


@dataclass(frozen=True, slots=True)
class Selector:
    name: str
    labels: tuple[tuple[str, str], ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.labels)


def parse_spec(spec: str) -> list[Selector]:
    """`a{x="1"}|b` → selectors, tried in order (the first family present wins). Raises ValueError."""
    if not spec:
        return []
    out = []
    for part in spec.split("|"):
        m = _SPEC_RE.match(part)
        if m is None:
            raise ValueError(f"invalid metric spec {part!r} (expected name or name{{label=value}})")
        raw = m.group(2) or ""
        labels = parse_labels(raw) if '"' in raw else _bare_labels(raw)
        out.append(Selector(m.group(1), tuple(sorted(labels.items()))))
    return out


def _bare_labels(raw: str) -> dict[str, str]:
    out = {}
    for item in raw.split(","):
        if item.strip():
            k, sep, v = item.partition("=")
            if not sep:
                raise ValueError(f"invalid label matcher {item!r}")
            out[k.strip()] = v.strip().strip("'")
    return out


@dataclass(frozen=True, slots=True)
class EngineConfig:
    name: str
    queued: tuple[Selector, ...]
    running: tuple[Selector, ...]
    kv_usage: tuple[Selector, ...]
    lora: tuple[Selector, ...]
    cache_info: tuple[Selector, ...]
    block_size_label: str = "block_size"
    num_blocks_label: str = "num_gpu_blocks"
    prefix_queries: tuple[Selector, ...] = ()
    prefix_hits: tuple[Selector, ...] = ()

    @classmethod
    def from_specs(
        cls,
        name: str,
        queued: str,
        running: str,
        kv: str,
        lora: str = "",
        cache_info: str = "",
        block_size_label: str = "block_size",
        num_blocks_label: str = "num_gpu_blocks",
        prefix_queries: str = "",
        prefix_hits: str = "",
    ) -> EngineConfig:
        return cls(
            name,
            tuple(parse_spec(queued)),
            tuple(parse_spec(running)),
            tuple(parse_spec(kv)),
            tuple(parse_spec(lora)),
            tuple(parse_spec(cache_info)),
            block_size_label,
            num_blocks_label,
            tuple(parse_spec(prefix_queries)),
            tuple(parse_spec(prefix_hits)),
        )


BUILTIN_ENGINES: dict[str, EngineConfig] = {
    "vllm": EngineConfig.from_specs(
        "vllm",
        "vllm:num_requests_waiting",
        "vllm:num_requests_running",
        "vllm:kv_cache_usage_perc|vllm:gpu_cache_usage_perc",
        "vllm:lora_requests_info",
        "vllm:cache_config_info",
        prefix_queries="vllm:prefix_cache_queries_total|vllm:prefix_cache_queries",
        prefix_hits="vllm:prefix_cache_hits_total|vllm:prefix_cache_hits",
    ),
    "sglang": EngineConfig.from_specs(
        "sglang",
        "sglang:num_queue_reqs",
        "sglang:num_running_reqs",
        "sglang:token_usage",
        "",
        "sglang:cache_config_info",
        block_size_label="page_size",
        num_blocks_label="num_pages",
        prefix_queries="sglang:prompt_tokens_total",
        prefix_hits="sglang:cached_tokens_total",  # summed over cache_source
    ),
    "trtllm-serve": EngineConfig.from_specs(
        "trtllm-serve",
        "trtllm_num_requests_waiting",
        "trtllm_num_requests_running",
        "trtllm_kv_cache_utilization",
        "",
        "trtllm_cache_config_info",
    ),
    "triton-tensorrt-llm": EngineConfig.from_specs(
        "triton-tensorrt-llm",
        'nv_trt_llm_request_metrics{request_type="waiting"}',
        'nv_trt_llm_request_metrics{request_type="scheduled"}',
        'nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction"}',
    ),
    # Triton Inference Server for non-LLM models (llm-d-router's `triton`): queue and running counts, no KV.
    "triton": EngineConfig.from_specs(
        "triton",
        "nv_inference_pending_request_count",
        "nv_inference_exec_count",
        "",
    ),
}


def _csv(v: str | None) -> frozenset[str]:
    if not v:
        return frozenset()
    return frozenset(s.strip() for s in v.split(",") if s.strip())


class CoreMetricsExtractor:
    """Turns a scraped page into a new Metrics object (the caller swaps it into the Endpoint atomically)."""

    def __init__(
        self,
        engines: Mapping[str, EngineConfig] | None = None,
        engine_label: str = ENGINE_LABEL,
        default_engine: str = "vllm",
    ) -> None:
        self.engines = dict(BUILTIN_ENGINES)
        self.engines.update(engines or {})
        self.engine_label = engine_label
        self.default_engine = default_engine
        self._missing_logged: set[tuple[str, str]] = set()

    def engine_for(self, endpoint: Endpoint) -> EngineConfig:
        name = endpoint.labels.get(self.engine_label) or self.default_engine
        return self.engines.get(name) or self.engines[self.default_engine]

    def _samples(self, text: str, selectors: tuple[Selector, ...], endpoint: Endpoint) -> list[Sample] | None:
        for sel in selectors:
            found = find_family(text, sel.name)
            if found:
                return [s for s in found if sel.matches(s[0])] if sel.labels else found
        if selectors:
            key = (endpoint.name, selectors[0].name)
            if key not in self._missing_logged:
                self._missing_logged.add(key)
                log.log(
                    V(DEFAULT), "endpoint %s: metric %s not found in its metrics page", endpoint.name, selectors[0].name
                )
        return None

    def extract(self, text: str, endpoint: Endpoint, now: float | None = None) -> Metrics:
        eng = self.engine_for(endpoint)
        m = Metrics(update_time=time.monotonic() if now is None else now)
        prev = endpoint.metrics
        q = self._samples(text, eng.queued, endpoint)
        if q:
            m.waiting_queue_size = int(sum(v for _, v in q))
        r = self._samples(text, eng.running, endpoint)
        if r:
            m.running_requests_size = int(sum(v for _, v in r))
        kv = self._samples(text, eng.kv_usage, endpoint)
        if kv:
            m.kv_cache_usage_percent = sum(v for _, v in kv) / len(kv)
        if eng.lora:
            lora = self._samples(text, eng.lora, endpoint)
            if lora:
                labels, _ = max(lora, key=lambda s: s[1])  # the newest series (value = creation timestamp)
                m.active_models = _csv(labels.get("running_lora_adapters"))
                m.waiting_models = _csv(labels.get("waiting_lora_adapters"))
                try:
                    m.max_active_models = int(float(labels.get("max_lora") or 0))
                except ValueError:
                    m.max_active_models = 0
        if eng.cache_info:
            info = self._samples(text, eng.cache_info, endpoint)
            if info:
                labels = info[0][0]
                m.cache_block_size = _int_label(labels, eng.block_size_label)
                m.cache_num_blocks = _int_label(labels, eng.num_blocks_label)
            else:
                m.cache_block_size, m.cache_num_blocks = prev.cache_block_size, prev.cache_num_blocks
        if eng.prefix_queries and eng.prefix_hits:  # counters: both or neither (the delivered-hits loop's deltas)
            pq = self._samples(text, eng.prefix_queries, endpoint)
            ph = self._samples(text, eng.prefix_hits, endpoint)
            if pq and ph:
                m.prefix_cache_queries = sum(v for _, v in pq)
                m.prefix_cache_hits = sum(v for _, v in ph)
        return m


def _int_label(labels: Mapping[str, str], key: str) -> int:
    try:
        return int(float(labels.get(key) or 0))
    except ValueError:
        return 0
