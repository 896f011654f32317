"""pyepp's default (issue 11 item 7): config/pyepp-default.yaml is what `epp serve` runs when the config has no
plugin section, and it routes pods that publish no KV events at least as GIE's approximate default would."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import yaml

from epp.config import load_config, parse_config
from epp.config.loader import DEFAULT_PLUGINS_YAML
from epp.datalayer.datastore import Datastore
from epp.datalayer.objectives import ObjectiveStore
from epp.framework import ApiKind, Endpoint, InferenceRequest, Metrics
from epp.requestcontrol.director import SchedulingDirector
from epp.wiring import plugin_context
from epp.wiring.builder import build_pipeline

CONFIG = Path(__file__).resolve().parents[2] / "config" / "pyepp-default.yaml"


def routing(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: doc.get(k) for k in ("plugins", "schedulingProfiles")}


def test_the_builtin_default_is_the_shipped_file() -> None:
    shipped = routing(yaml.safe_load(CONFIG.read_text()))
    builtin = routing(yaml.safe_load(DEFAULT_PLUGINS_YAML))
    assert builtin == shipped, (
        "config/pyepp-default.yaml changed: copy its plugins and schedulingProfiles to DEFAULT_PLUGINS_YAML in "
        "epp/config/loader.py and to the chart's default values (charts/pyepp/values.yaml, "
        "inferenceExtension.scheduling)"
    )


def test_no_plugin_section_builds_what_the_file_builds() -> None:
    implicit = build_pipeline(parse_config("{}"), plugin_context(Datastore()))
    explicit = build_pipeline(load_config(CONFIG), plugin_context(Datastore()))
    assert sorted(implicit.plugins) == sorted(explicit.plugins)
    for name, plugin in implicit.plugins.items():
        assert type(plugin) is type(explicit.plugins[name])
    assert [p.name for p in implicit.producers] == [p.name for p in explicit.producers]


def pool(n: int) -> Datastore:
    ds = Datastore()
    eps = []
    for i in range(n):
        e = Endpoint(f"pod-{i}", f"10.0.0.{i + 1}", 8000)
        # as scraped from vLLM (cache_config_info): the block size keys the prompt for the KV index
        e.metrics = Metrics(update_time=time.monotonic(), cache_block_size=16, cache_num_blocks=2000)
        eps.append(e)
    ds.replace_all(eps)
    return ds


def chat(text: str, rid: str) -> InferenceRequest:
    msgs = [{"role": "user", "content": text}]
    body = {"model": "m", "messages": msgs, "max_tokens": 16}
    return InferenceRequest(rid, "/v1/chat/completions", ApiKind.CHAT, "m", "m", body, messages=msgs,
                            body_size=len(json.dumps(body)))  # fmt: skip


async def test_default_without_kv_events_keeps_a_shared_prefix_on_its_pod() -> None:
    """No pod publishes KV events (nothing subscribes here): the default still keeps requests that share a long
    prefix on one pod, and sends an unrelated prompt elsewhere (its prefill backlog is lower). Without the
    fallback every pod would look cold and the turns would spread by load alone."""
    ds = pool(3)
    cfg = parse_config("{}")
    ctx = plugin_context(ds)
    d = SchedulingDirector(ds, build_pipeline(cfg, ctx), ObjectiveStore(cfg.objectives))
    for warm in getattr(ctx.services, "warmups", []):  # as the server does before it reports ready
        await warm()
    prefix = "You are a helpful assistant who answers questions about the quarterly report. " * 40
    r0 = chat(prefix + "Q0", "r0")
    first = await d.handle_request(r0)
    await asyncio.sleep(0)  # the history records the pick right after the decision
    d.handle_response_complete(r0, first, None)
    # a chat turn comes after the previous answer: the prefill estimated there (551 tokens at the default 15928
    # tokens/s) is done; a prompt sent while it still runs may go to an idle pod, whose parallel prefill is faster
    await asyncio.sleep(0.05)
    for i in range(1, 6):
        r = chat(prefix + f"Q{i}", f"r{i}")
        again = await d.handle_request(r)
        assert again.destination == first.destination
        await asyncio.sleep(0)
        if i < 5:
            d.handle_response_complete(r, again, None)
            await asyncio.sleep(0.05)
    # the last turn is still in flight there: an unrelated prompt (cached nowhere) goes to an idle pod
    other = await d.handle_request(chat("An unrelated question about something else entirely. " * 40, "x"))
    assert other.destination != first.destination
