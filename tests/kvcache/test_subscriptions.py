"""Where the subscriptions connect, and how they follow the Datastore: a relabelled KV-events port moves the
subscription (vLLM's publisher on tcp, found through the port labels); a label that is not a port is a counted
config error, not an exception."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from typing import Any

import pytest
import zmq

from epp.datalayer.datastore import Datastore
from epp.framework import DataMap, Endpoint
from epp.kvcache.config import PoolConfig
from epp.kvcache.subscriptions import (
    EVENTS_ENDPOINT_ATTR,
    EVENTS_PORT_LABEL,
    REPLAY_PORT_LABEL,
    EventEndpoints,
    event_endpoints,
)
from tests.kvcache.vllm_rig import BS, MODEL, TOKENS, Rig, batch, endpoint, free_port, stored, until


def start_tcp(publishers: Any) -> Any:
    return publishers.start(topic=f"kv@x@{MODEL}", endpoint=f"tcp://*:{free_port()}")


def labelled(name: str, port: int, pub: Any, **extra: str) -> Endpoint:
    """An endpoint at 127.0.0.1:`port` that names `pub`'s ports in the KV-events labels, as a pod spec would."""
    labels = {
        EVENTS_PORT_LABEL: pub.endpoint.rpartition(":")[2],
        REPLAY_PORT_LABEL: pub.replay.rpartition(":")[2],
        **extra,
    }
    return Endpoint(name, "127.0.0.1", port, labels=labels)


async def test_relabelled_events_port_moves_the_subscription(rig: Rig, publishers: Any, vllm_kv: Any) -> None:
    kv, pod, subs = vllm_kv, "127.0.0.1:8000", rig.pool.subscriptions
    old, new = start_tcp(publishers), start_tcp(publishers)
    ds = Datastore()
    ds.subscribe(subs)
    ds.upsert(labelled("a", 8000, old))
    old.publish(batch(kv, stored(kv, [1, 2, 3, 4], None, TOKENS[: 4 * BS])))
    await until(lambda: rig.blocks(TOKENS, pod) == 4)
    # a relabel that leaves the events endpoint alone keeps the subscription and the blocks
    task = subs._subs[pod][2]
    ds.upsert(labelled("a", 8000, old, team="x"))
    assert subs._subs[pod][2] is task and task is not None and not task.done()
    assert rig.blocks(TOKENS, pod) == 4
    # the engine now publishes on other ports: the same pod (name, address) relabelled in place
    ds.upsert(labelled("a", 8000, new))
    assert subs._subs[pod][0] == new.endpoint
    other = list(range(5000, 5000 + 2 * BS))
    new.publish(batch(kv, stored(kv, [901, 902], None, other)))
    await until(lambda: rig.blocks(other, pod) == 2)
    # the old publisher's blocks went with its subscription, and what it sends no longer arrives
    assert rig.blocks(TOKENS, pod) == 0
    old.publish(batch(kv, stored(kv, [1, 2], None, TOKENS[: 2 * BS])))
    await asyncio.sleep(0.3)
    assert rig.blocks(TOKENS, pod) == 0


async def test_port_label_that_is_not_a_port_is_a_counted_config_error(
    rig: Rig, publishers: Any, vllm_kv: Any, caplog: pytest.LogCaptureFixture
) -> None:
    kv, subs = vllm_kv, rig.pool.subscriptions
    caplog.set_level(logging.WARNING)
    ds = Datastore()
    ds.subscribe(subs)
    good = start_tcp(publishers)
    ds.upsert(Endpoint("bad", "127.0.0.1", 8001, labels={EVENTS_PORT_LABEL: "abc"}))
    ds.upsert(labelled("good", 8000, good))
    assert rig.metric("kv_cache_events_config_errors_total", reason="bad_port_label") == 1
    lines = [r.getMessage() for r in caplog.records if "abc" in r.getMessage()]
    assert len(lines) == 1 and "bad" in lines[0] and EVENTS_PORT_LABEL in lines[0]
    assert not [r for r in caplog.records if r.exc_info]  # nothing escaped into the Datastore's handler
    assert "127.0.0.1:8001" not in subs._subs  # no subscription for it
    # the other pod is unaffected
    good.publish(batch(kv, stored(kv, [1, 2], None, TOKENS[: 2 * BS])))
    await until(lambda: rig.blocks(TOKENS, "127.0.0.1:8000") == 2)
    # an out-of-range replay port: counted too; the events are still subscribed, without replay
    subs.endpoint_added(Endpoint("c", "127.0.0.1", 8002, labels={EVENTS_PORT_LABEL: "6000", REPLAY_PORT_LABEL: "0"}))
    assert rig.metric("kv_cache_events_config_errors_total", reason="bad_port_label") == 2
    assert subs._subs["127.0.0.1:8002"][:2] == ("tcp://127.0.0.1:6000", None)
    # fixing the label (an update in place) subscribes the pod
    fixed = start_tcp(publishers)
    ds.upsert(labelled("bad", 8001, fixed))
    fixed.publish(batch(kv, stored(kv, [7, 8], None, TOKENS[: 2 * BS])))
    await until(lambda: rig.blocks(TOKENS, "127.0.0.1:8001") == 2)


def test_event_endpoints_from_attributes_labels_and_config() -> None:
    cfg = PoolConfig(socket_port=5557, replay_port=5600)
    assert event_endpoints(Endpoint("p-rank-1", "10.0.0.1", 8001), cfg) == EventEndpoints(
        "tcp://10.0.0.1:5558", "tcp://10.0.0.1:5601"
    )
    assert event_endpoints(Endpoint("p", "fd00::1", 8000), PoolConfig()) == EventEndpoints("tcp://[fd00::1]:5557", None)
    by_label = Endpoint("p", "10.0.0.1", 8000, labels={EVENTS_PORT_LABEL: "6000", REPLAY_PORT_LABEL: " 6001 "})
    assert event_endpoints(by_label, cfg) == EventEndpoints("tcp://10.0.0.1:6000", "tcp://10.0.0.1:6001")
    by_attr = Endpoint(
        "p", "10.0.0.1", 8000, labels={EVENTS_PORT_LABEL: "abc"}, attributes=DataMap({EVENTS_ENDPOINT_ATTR: "ipc://x"})
    )
    assert event_endpoints(by_attr, cfg).pub == "ipc://x"  # the attribute wins; the label is not even read
    for value in ("abc", "0", "65536", "-1", "5557.0", "²"):
        bad = Endpoint("p", "10.0.0.1", 8000, labels={EVENTS_PORT_LABEL: value, REPLAY_PORT_LABEL: value})
        assert event_endpoints(bad, cfg) == EventEndpoints(
            None, None, ((EVENTS_PORT_LABEL, value), (REPLAY_PORT_LABEL, value))
        ), value


async def test_bursts_and_single_batches_after_idle_all_arrive(rig: Rig, publishers: Any, vllm_kv: Any) -> None:
    """The receive loop drains the socket on each wake-up of its FD: a burst arrives whole, and so does each lone
    batch published after the loop went idle (a wake-up missed after a drain would leave it in the socket)."""
    kv, pod = vllm_kv, "127.0.0.1:8000"
    pub = start_tcp(publishers)
    rig.pool.subscriptions.endpoint_added(labelled("a", 8000, pub))
    first = list(range(10_000, 10_000 + BS))
    pub.publish(batch(kv, stored(kv, [1], None, first)))
    await until(lambda: rig.blocks(first, pod) == 1)
    # a burst: 200 one-block batches of their own prompts, sent back to back
    prompts = [list(range(20_000 + i * BS, 20_000 + (i + 1) * BS)) for i in range(200)]
    for i, tokens in enumerate(prompts):
        pub.publish(batch(kv, stored(kv, [100 + i], None, tokens)))
    await until(lambda: all(rig.blocks(t, pod) == 1 for t in prompts))
    # then lone batches, each after the loop has been idle

    def stored_once(tokens: list[int]) -> bool:
        return rig.blocks(tokens, pod) == 1

    for i in range(5):
        await asyncio.sleep(0.1)
        tokens = list(range(90_000 + i * BS, 90_000 + (i + 1) * BS))
        pub.publish(batch(kv, stored(kv, [900 + i], None, tokens)))
        await until(functools.partial(stored_once, tokens), timeout=2.0)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_central_socket_receives_on_either_event_loop(loop: str) -> None:
    """`--event-loop uvloop` runs the same receive loop (a reader on the socket's FD): batches arrive on both."""
    from e2e.bench.index.kvcache import central_pool, make_payloads
    from epp.server.eventloop import loop_factory

    async def main() -> int:
        port, idx, _pool, task = await central_pool()
        pub: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.PUB)
        pub.connect(f"tcp://127.0.0.1:{port}")
        try:
            payloads = make_payloads(20, 1, 4, 1)
            await asyncio.sleep(0.3)  # PUB/SUB: the connection first
            for i, p in enumerate(payloads):
                pub.send_multipart([b"kv@10.0.0.9:8000@m", i.to_bytes(8, "big"), p])
            await until(lambda: len(idx) == 80)
            return len(idx)
        finally:
            pub.close(linger=0)
            task.cancel()

    _, factory = loop_factory(loop)
    with asyncio.Runner(loop_factory=factory) as runner:
        assert runner.run(main()) == 80


async def publish_until(cond: Callable[[], bool], pub: Any, b: Any, timeout: float = 10.0) -> None:
    """Publish `b` until `cond` (the first after a subscription starts can go before it reaches the publisher, and
    then arrives by replay only, which taps do not see)."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "never seen"
        pub.publish(b)
        await asyncio.sleep(0.1)


async def test_tap_sees_every_frame_and_fed_subscriptions_open_no_socket(
    rig: Rig, publishers: Any, vllm_kv: Any
) -> None:
    """`--workers`: worker 0's subscriptions hand each frame to their tap; another worker's are `fed`: they follow
    the endpoints but subscribe to nothing, and take the frames they are given for the pods they follow."""
    kv, pod, subs = vllm_kv, "127.0.0.1:8000", rig.pool.subscriptions
    pub = publishers.start(topic=f"kv@x@{MODEL}")
    seen: list[tuple[str, str, list[bytes]]] = []
    subs.tap = lambda *frame: seen.append(frame)
    ds = Datastore()
    ds.subscribe(subs)
    ds.upsert(endpoint("a", 8000, pub))
    await publish_until(lambda: bool(seen), pub, batch(kv, stored(kv, [1, 2, 3, 4], None, TOKENS[: 4 * BS])))
    await until(lambda: rig.blocks(TOKENS, pod) == 4)
    assert seen[0][:2] == (pod, pub.replay) and len(seen[0][2]) == 3

    fed = Rig(PoolConfig(topic_filter="kv@", default_model=MODEL))
    fed.pool.subscriptions.fed = True
    task = asyncio.create_task(fed.pool.run())
    try:
        fds = Datastore()
        fds.subscribe(fed.pool.subscriptions)
        fds.upsert(endpoint("a", 8000, pub))
        await fed.pool.started()
        assert fed.pool.subscriptions._subs[pod] == (pub.endpoint, pub.replay, None)
        assert fed.metric("kv_cache_events_active_subscribers") == 0
        assert fed.pool.subscriptions.receive(pod, "", seen[0][2])
        assert not fed.pool.subscriptions.receive("127.0.0.1:9999", "", seen[0][2])  # not followed here
        await until(lambda: fed.blocks(TOKENS, pod) == 4)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_fed_central_mode_binds_nothing_and_takes_the_pool_pods_topics(
    rig: Rig, publishers: Any, vllm_kv: Any
) -> None:
    """Central bind with `--workers`: worker 0 alone binds the socket; another worker's fed subscriptions take the
    frames it forwards (no pod: the topic names it) for the pool's pods only, as the bound socket would."""
    kv, subs = vllm_kv, rig.pool.subscriptions
    pub = publishers.start(topic=f"kv@x@{MODEL}")
    seen: list[list[bytes]] = []
    subs.tap = lambda _pod, _replay, frames: seen.append(frames)
    ds = Datastore()
    ds.subscribe(subs)
    ds.upsert(endpoint("a", 8000, pub))
    await publish_until(lambda: bool(seen), pub, batch(kv, stored(kv, [1, 2, 3, 4], None, TOKENS[: 4 * BS])))
    _, seq, payload = seen[0]

    fed = Rig(PoolConfig(topic_filter="kv@", default_model=MODEL, zmq_endpoint=f"tcp://127.0.0.1:{free_port()}"))
    fed.pool.subscriptions.fed = True
    task = asyncio.create_task(fed.pool.run())
    try:
        fds = Datastore()
        fds.subscribe(fed.pool.subscriptions)
        fds.upsert(Endpoint("a", "127.0.0.1", 8000))
        await fed.pool.started()
        assert fed.pool.subscriptions.bound_endpoint is None and fed.metric("kv_cache_events_active_subscribers") == 0
        pod = "127.0.0.1:8000"
        assert fed.pool.subscriptions.receive("", "", [f"kv@{pod}@{MODEL}".encode(), seq, payload])
        await until(lambda: fed.blocks(TOKENS, pod) == 4)
        fed.pool.subscriptions.receive("", "", [f"kv@10.9.9.9:8000@{MODEL}".encode(), seq, payload])
        assert fed.metric("kv_cache_events_dropped_total", reason="unknown_pod") == 1
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
