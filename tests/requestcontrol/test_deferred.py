"""DeferredRecords: the records-only PreRequest hooks held back from the answer path, run in pick order, a pick whose
endpoint left the pool dropped, a failing hook logged without costing the others their run."""

from __future__ import annotations

import logging

import pytest

from epp.datalayer.datastore import Datastore
from epp.framework import Endpoint, InferenceRequest, Plugin, ProfileResult, SchedulingResult
from epp.plugins.producers.inflight_load_producer import InFlightLoadProducer
from epp.requestcontrol.deferred import DeferredRecords
from epp.requestcontrol.director import SchedulingDirector
from tests.requestcontrol.support import chat, director, pool


class Recorder(Plugin):
    """A records-only hook that notes (its name, the request, the primary endpoint) of every pick it sees."""

    records_only = True

    def __init__(self, name: str, seen: list[tuple[str, str, str]], fail_on: str = "") -> None:
        super().__init__(name)
        self.seen = seen
        self.fail_on = fail_on

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        if request.request_id == self.fail_on:
            raise RuntimeError("plugin bug")
        self.seen.append((self.name, request.request_id, result.targets[0].name))


def _pool(*names: str) -> Datastore:
    ds = Datastore()
    ds.replace_all([Endpoint(n, f"10.0.0.{i + 1}", 8000) for i, n in enumerate(names)])
    return ds


def _pick(
    ds: Datastore, rid: str, decode: str, prefill: str | None = None
) -> tuple[InferenceRequest, SchedulingResult]:
    ep = ds.get(decode)
    assert ep is not None
    results: dict[str, ProfileResult] = {"decode": ProfileResult([ep])}
    if prefill is not None:
        pre = ds.get(prefill)
        assert pre is not None
        results["prefill"] = ProfileResult([pre])
    return chat("x", rid=rid), SchedulingResult(results, "decode")


def _records(ds: Datastore, *hooks: Plugin) -> DeferredRecords:
    return DeferredRecords(ds, list(hooks), SchedulingDirector._run_pre_request)  # type: ignore[arg-type]


def test_held_picks_run_in_pick_order_once() -> None:
    ds = _pool("a", "b", "c")
    seen: list[tuple[str, str, str]] = []
    records = _records(ds, Recorder("first", seen), Recorder("second", seen))
    for rid, ep in (("1", "c"), ("2", "a"), ("3", "b")):
        records.hold(*_pick(ds, rid, ep))
    assert seen == []  # held: nothing runs until run()
    records.run()
    assert seen == [
        ("first", "1", "c"),
        ("second", "1", "c"),
        ("first", "2", "a"),
        ("second", "2", "a"),
        ("first", "3", "b"),
        ("second", "3", "b"),
    ]
    assert records.pending == []
    records.run()  # nothing left: a second run books nothing twice
    assert len(seen) == 6
    records.hold(*_pick(ds, "4", "a"))  # a pick held after a run waits for the next one
    assert len(seen) == 6
    records.run()
    assert seen[-2:] == [("first", "4", "a"), ("second", "4", "a")]


def test_a_pick_whose_endpoint_left_the_pool_is_dropped(caplog: pytest.LogCaptureFixture) -> None:
    """Any profile's endpoint counts: a P/D pick whose prefill pod left is dropped whole; the picks before and
    after it still run, and a profile that picked nothing (None) is no reason to drop."""
    caplog.set_level(logging.DEBUG, logger="epp.requestcontrol.director")
    ds = _pool("a", "b", "p")
    seen: list[tuple[str, str, str]] = []
    records = _records(ds, Recorder("rec", seen))
    records.hold(*_pick(ds, "1", "a"))
    records.hold(*_pick(ds, "2", "b"))  # its decode pod leaves
    records.hold(*_pick(ds, "3", "a", prefill="p"))  # its prefill pod leaves
    request, result = _pick(ds, "4", "a")
    result.profile_results["prefill"] = None  # type: ignore[assignment]
    records.hold(request, result)
    ds.remove("b")
    ds.remove("p")
    records.run()
    assert seen == [("rec", "1", "a"), ("rec", "4", "a")]
    dropped = [r.getMessage() for r in caplog.records if "left the pool" in r.getMessage()]
    assert dropped == [
        "request 2: its endpoint left the pool before its records ran",
        "request 3: its endpoint left the pool before its records ran",
    ]
    assert records.pending == []


def test_a_failing_record_is_logged_and_the_others_still_run(caplog: pytest.LogCaptureFixture) -> None:
    """One hook raising on one pick: the error is logged with the hook and the request, the other hooks of that pick
    and every later pick still run, and nothing is left pending (or run again on the next run)."""
    ds = _pool("a", "b")
    seen: list[tuple[str, str, str]] = []
    records = _records(ds, Recorder("buggy", seen, fail_on="1"), Recorder("after", seen))
    records.hold(*_pick(ds, "1", "a"))
    records.hold(*_pick(ds, "2", "b"))
    with caplog.at_level(logging.ERROR, logger="epp.requestcontrol.director"):
        records.run()
    assert seen == [("after", "1", "a"), ("buggy", "2", "b"), ("after", "2", "b")]
    (err,) = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert err.getMessage() == "PreRequest plugin buggy failed for request 1"
    assert err.exc_info is not None and isinstance(err.exc_info[1], RuntimeError)
    assert records.pending == []
    records.run()
    assert len(seen) == 3


async def test_a_held_back_booking_for_an_endpoint_that_left_the_pool_is_dropped() -> None:
    """The endpoint a request was picked for leaves the pool while the answer is written: its held-back booking does
    not bring back the state the plugins dropped for it; the other endpoint's booking still runs."""
    ds = pool(2)
    d = director(ds, "plugins: [{type: active-request-scorer}]")
    producer = d.pipeline.plugins["inflight-load-producer"]
    assert isinstance(producer, InFlightLoadProducer)
    r1, r2 = chat("a", rid="1"), chat("b", rid="2")
    d1 = await d.handle_request(r1, defer_records=True)
    gone = d1.endpoints[0].name
    ds.remove(gone)
    d2 = await d.handle_request(r2, defer_records=True)  # flushes r1's records first
    kept = d2.endpoints[0].name
    assert gone != kept and gone not in producer.loads
    d.run_deferred()
    assert gone not in producer.loads
    assert producer.loads[kept].requests == 1
    d.handle_response_complete(r1, d1, None)
    d.handle_response_complete(r2, d2, None)
    assert gone not in producer.loads and producer.loads[kept].requests == 0

    # A P/D pick whose prefill pod left: nothing of it is booked, the decode pod that stayed included.
    ds2 = pool(3)
    d = director(ds2, "plugins: [{type: active-request-scorer}]")
    producer = d.pipeline.plugins["inflight-load-producer"]
    assert isinstance(producer, InFlightLoadProducer)
    r3 = chat("c", rid="3")
    d3 = await d.handle_request(r3, defer_records=True)
    assert d3.result is not None
    decode = d3.endpoints[0]
    prefill = next(ep for ep in ds2.endpoints() if ep is not decode)
    d3.result.profile_results["prefill"] = ProfileResult([prefill])
    ds2.remove(prefill.name)
    d.run_deferred()
    assert prefill.name not in producer.loads and producer.loads[decode.name].requests == 0
