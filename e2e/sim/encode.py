"""E/P/D: the multimodal encoder stage of a simulated vLLM (encoder cache, `ec_transfer_params`, shared storage).

Every chat request's multimodal content parts (`image_url`, `audio_url`, `video_url`, `input_audio`) need their
encoder output before the prefill. Per distinct item (hash of the part): already in this pod's encoder cache → free;
named by the request's `ec_transfer_params` (vLLM's EC NIXL connector) or present in `--ec-shared-storage-path`
(vLLM's ECExampleConnector) → loaded in `--ec-transfer-time-per-item`; else computed in `--encode-time-per-item`.
A pod with `--role encode` (an encoder instance, vLLM's `ec_producer`) computes the items, writes them to the shared
storage when one is set, and answers `ec_transfer_params: {<item hash>: {...}}` for the decode-side sidecar to pass
on. Counter `sim:encoder_items_total{source: computed|cached|transferred|shared_storage}`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections import OrderedDict
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from e2e.sim.config import SimConfig
from e2e.sim.engine import EngineError

MM_TYPES = frozenset({"image_url", "audio_url", "video_url", "input_audio"})
CACHE_ITEMS = 4096


def item_hash(part: dict[str, Any]) -> str:
    kind = part.get("type")
    inner = part.get(kind) if isinstance(kind, str) else None
    return hashlib.sha256(json.dumps([kind, inner], sort_keys=True, default=str).encode()).hexdigest()[:32]


def mm_parts(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    out: list[dict[str, Any]] = []
    for msg in messages if isinstance(messages, list) else []:
        content = msg.get("content") if isinstance(msg, dict) else None
        for part in content if isinstance(content, list) else []:
            if isinstance(part, dict) and part.get("type") in MM_TYPES:
                out.append(part)
    return out


class EncoderStage:
    def __init__(self, cfg: SimConfig, registry: CollectorRegistry) -> None:
        self.cfg = cfg
        self.cache: OrderedDict[str, None] = OrderedDict()
        self.items = Counter(
            "sim:encoder_items", "Multimodal items by where their encoder output came from.",
            ["model_name", "source"], registry=registry,
        )  # fmt: skip
        self.storage = Path(cfg.ec_shared_storage_path) if cfg.ec_shared_storage_path else None

    async def run(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """Wait for this request's encoder outputs; the `ec_transfer_params` to answer (encode role) or None."""
        params = body.get("ec_transfer_params")
        if params is not None and not isinstance(params, dict):
            raise EngineError(400, "`ec_transfer_params` must be an object.")
        hashes = list(dict.fromkeys(item_hash(p) for p in mm_parts(body)))
        if not hashes:
            return None
        cfg = self.cfg
        delay = 0.0
        for h in hashes:
            if h in self.cache:
                source = "cached"
            elif params and h in params:
                source, delay = "transferred", delay + cfg.ec_transfer_time_per_item
            elif self.storage is not None and (self.storage / h).exists():
                source, delay = "shared_storage", delay + cfg.ec_transfer_time_per_item
            else:
                source, delay = "computed", delay + cfg.encode_time_per_item
            self.items.labels(cfg.model_name, source).inc()
            self.cache[h] = None
            self.cache.move_to_end(h)
            while len(self.cache) > CACHE_ITEMS:
                self.cache.popitem(last=False)
        if delay:
            await asyncio.sleep(delay * cfg.time_scale)
        if cfg.role != "encode":
            return None
        if self.storage is not None:
            self.storage.mkdir(parents=True, exist_ok=True)
            for h in hashes:
                (self.storage / h).write_text(cfg.pod)
        engine_id = f"{cfg.pod}-encoder"
        return {h: {"remote_engine_id": engine_id, "remote_host": cfg.pod_ip, "remote_port": cfg.port} for h in hashes}
