"""The FlowController: a request with no endpoint waits for one until its TTL."""

from __future__ import annotations

import asyncio
import time

import pytest

from epp.datalayer.datastore import Datastore
from epp.requestcontrol.flowcontrol_spec import FlowControlSpec
from tests.plugins.flowcontrol.support import QUEUE, chat_req, fc_director, pool


async def test_no_endpoint_request_ttl_waits_for_an_endpoint() -> None:
    from epp.framework import ServiceUnavailable

    ds = Datastore()
    d = fc_director(ds, QUEUE, FlowControlSpec(no_endpoint_request_ttl=1.0))
    pending = asyncio.create_task(d.handle_request(chat_req("r")))
    await asyncio.sleep(0.1)
    assert not pending.done()  # no endpoint yet: it waits instead of a 503
    fresh_pool = pool(0)
    ds.replace_all(list(fresh_pool.endpoints()))
    decision = await asyncio.wait_for(pending, 1)
    assert decision.endpoints[0].name == "pod-0"
    empty = fc_director(Datastore(), QUEUE, FlowControlSpec(no_endpoint_request_ttl=0.1))
    t0 = time.monotonic()
    with pytest.raises(ServiceUnavailable):
        await empty.handle_request(chat_req("x"))
    assert 0.09 <= time.monotonic() - t0 < 1.0
    with pytest.raises(ServiceUnavailable):  # without the setting: at once, as before
        await fc_director(Datastore(), QUEUE, FlowControlSpec()).handle_request(chat_req("y"))
