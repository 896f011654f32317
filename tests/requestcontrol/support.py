"""Helpers shared by the request-control tests: a pool, a director built from a config, a chat request."""

from __future__ import annotations

import json
import time
from typing import Any

import yaml

from epp.config import parse_config
from epp.config.loader import GIE_DEFAULT_PLUGINS_YAML
from epp.datalayer.datastore import Datastore
from epp.datalayer.objectives import ObjectiveStore
from epp.framework import ApiKind, Endpoint, InferenceRequest, Metrics
from epp.requestcontrol.director import SchedulingDirector
from epp.wiring import plugin_context
from epp.wiring.builder import build_pipeline


def pool(n: int, **metrics: Any) -> Datastore:
    ds = Datastore()
    eps = []
    for i in range(n):
        e = Endpoint(f"pod-{i}", f"10.0.0.{i + 1}", 8000, labels={"accelerator": "gpu"})
        e.metrics = Metrics(update_time=time.monotonic(), **metrics)
        eps.append(e)
    ds.replace_all(eps)
    return ds


def fresh(ds: Datastore, **metrics: Any) -> None:
    for e in ds.endpoints():
        e.metrics = Metrics(update_time=time.monotonic(), **metrics)


def with_gie_default(yaml_text: str) -> str:
    """`yaml_text` with GIE's default plugins when it configures none: these tests are about the director, which
    they drive through GIE's classic chain (pyepp's own default is tested in test_default_config_*)."""
    raw = yaml.safe_load(yaml_text) or {}
    if raw.get("plugins") or raw.get("schedulingProfiles"):
        return yaml_text
    return yaml.safe_dump({**raw, **yaml.safe_load(GIE_DEFAULT_PLUGINS_YAML)})


def director(ds: Datastore, yaml_text: str = "{}", **kw: Any) -> SchedulingDirector:
    cfg = parse_config(with_gie_default(yaml_text))
    pipeline = build_pipeline(cfg, plugin_context(ds))
    return SchedulingDirector(ds, pipeline, ObjectiveStore(cfg.objectives), **kw)


def chat(text: str, rid: str = "r", headers: dict[str, str] | None = None) -> InferenceRequest:
    msgs = [{"role": "user", "content": text}]
    body = {"model": "m", "messages": msgs}
    return InferenceRequest(
        rid,
        "/v1/chat/completions",
        ApiKind.CHAT,
        "m",
        "m",
        body,
        headers=headers or {},
        messages=msgs,
        body_size=len(json.dumps(body)),
    )
