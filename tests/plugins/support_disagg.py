"""Helpers shared by the P/D and E/P/D tests (pools with roles, directors built from configs)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from epp.config import parse_config
from epp.datalayer.datastore import Datastore
from epp.datalayer.objectives import ObjectiveStore
from epp.framework import (
    ApiKind,
    Endpoint,
    InferenceRequest,
    Metrics,
    PluginRegistry,
)
from epp.requestcontrol.director import SchedulingDirector
from epp.wiring import plugin_context
from epp.wiring.builder import build_pipeline


def chat(text: str, rid: str = "r", headers: dict[str, str] | None = None, content: Any = None) -> InferenceRequest:
    msgs = [{"role": "user", "content": content if content is not None else text}]
    body = {"model": "m", "messages": msgs}
    return InferenceRequest(
        rid, "/v1/chat/completions", ApiKind.CHAT, "m", "m", body, headers=headers or {}, messages=msgs
    )


CONFIG_DIR = Path(__file__).resolve().parents[2] / "config"


ROLE = "llm-d.ai/role"


LONG = "Summarize the following report in detail. " * 60  # ~600 tokens, uncached everywhere at first


def pd_pool(roles: Sequence[str | None] = ("prefill", "prefill", "decode", "decode")) -> Datastore:
    ds = Datastore()
    eps = []
    for i, role in enumerate(roles):
        e = Endpoint(f"pod-{i}", f"10.0.0.{i + 1}", 8000, labels={ROLE: role} if role else {})
        e.metrics = Metrics(update_time=time.monotonic())
        eps.append(e)
    ds.replace_all(eps)
    return ds


def director(ds: Datastore, text: str, registry: PluginRegistry | None = None) -> SchedulingDirector:
    cfg = parse_config(text)
    pipeline = build_pipeline(cfg, plugin_context(ds), registry)
    return SchedulingDirector(ds, pipeline, ObjectiveStore(cfg.objectives))


def sample(name: str) -> str:
    return (CONFIG_DIR / name).read_text()
