"""Helpers shared by the token-load and active-request scorer tests."""

from __future__ import annotations

from epp.datalayer.datastore import Datastore
from epp.framework import (
    TOKENIZED_PROMPT,
    ApiKind,
    CycleState,
    Endpoint,
    InferenceRequest,
    ProfileResult,
    SchedulingResult,
    TokenizedPrompt,
)
from epp.plugins.producers.inflight_load_producer import InFlightLoadProducer
from epp.wiring import plugin_context
from tests.helpers import build

S = CycleState()


def req(rid: str = "r", tokens: int = 100) -> InferenceRequest:
    r = InferenceRequest(rid, "/v1/completions", ApiKind.COMPLETIONS, "m", "m", {})
    r.data.put(TOKENIZED_PROMPT, TokenizedPrompt(list(range(tokens))))
    return r


def setup(n: int = 3) -> tuple[Datastore, list[Endpoint], InFlightLoadProducer]:
    ds = Datastore()
    eps = [Endpoint(c, f"10.0.0.{i + 1}", 8000) for i, c in enumerate("abcdef"[:n])]
    for e in eps:
        ds.upsert(e)
    p = build(InFlightLoadProducer, ctx=plugin_context(ds))
    return ds, eps, p


def book(p: InFlightLoadProducer, ep: Endpoint, tokens: int, rid: str) -> None:
    p.pre_request(req(rid, tokens), SchedulingResult({"default": ProfileResult([ep])}, "default"))
