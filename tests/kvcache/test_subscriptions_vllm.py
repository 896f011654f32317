"""vLLM's own ZmqEventPublisher and event structs → our pool → index; replay through vLLM's ROUTER."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from epp.framework import DataMap, Endpoint
from epp.kvcache.config import PoolConfig
from epp.kvcache.subscriptions import REPLAY_ENDPOINT_ATTR
from tests.kvcache.vllm_rig import BS, MODEL, TOKENS, Rig, TcpLink, batch, endpoint, stored, until


async def test_stores_removals_clears_from_real_vllm(rig: Rig, publishers: Any, vllm_kv: Any) -> None:
    kv = vllm_kv
    a = publishers.start(topic=f"kv@127.0.0.1:8000@{MODEL}")
    b = publishers.start(topic=f"kv@127.0.0.1:8001@{MODEL}")
    rig.pool.subscriptions.endpoint_added(endpoint("a", 8000, a))
    rig.pool.subscriptions.endpoint_added(endpoint("b", 8001, b))
    # a holds all 8 blocks (two chained events), b only the first 3
    a.publish(batch(kv, stored(kv, [101, 102, 103, 104], None, TOKENS[: 4 * BS])))
    a.publish(batch(kv, stored(kv, [105, 106, 107, 108], 104, TOKENS[4 * BS :])))
    b.publish(batch(kv, stored(kv, [201, 202, 203], None, TOKENS[: 3 * BS])))
    await until(lambda: rig.blocks(TOKENS, "127.0.0.1:8000") == 8 and rig.blocks(TOKENS, "127.0.0.1:8001") == 3)
    # a removal in the middle breaks a's consecutive prefix at block 5
    a.publish(batch(kv, kv.BlockRemoved(block_hashes=[106], medium="GPU")))
    await until(lambda: rig.blocks(TOKENS, "127.0.0.1:8000") == 5)
    # AllBlocksCleared (vLLM's reset_prefix_cache) empties a, leaves b
    a.publish(batch(kv, kv.AllBlocksCleared()))
    await until(lambda: rig.blocks(TOKENS, "127.0.0.1:8000") == 0)
    assert rig.blocks(TOKENS, "127.0.0.1:8001") == 3
    assert rig.metric("kv_cache_events_blocks_total", op="stored") == 11


async def test_mid_stream_join_replays_through_vllm_router(rig: Rig, publishers: Any, vllm_kv: Any) -> None:
    kv = vllm_kv
    a = publishers.start(topic=f"kv@x@{MODEL}")
    # published before anyone subscribed: lost on the PUB socket, kept in vLLM's replay buffer
    a.publish(batch(kv, stored(kv, [1, 2, 3, 4], None, TOKENS[: 4 * BS])))
    a.publish(batch(kv, stored(kv, [5, 6], 4, TOKENS[4 * BS : 6 * BS])))
    await asyncio.sleep(0.2)
    rig.pool.subscriptions.endpoint_added(endpoint("a", 8000, a))
    await asyncio.sleep(0.3)  # let the SUB connect
    a.publish(batch(kv, stored(kv, [7, 8], 6, TOKENS[6 * BS :])))
    await until(lambda: rig.blocks(TOKENS, "127.0.0.1:8000") == 8)
    assert rig.metric("kv_cache_events_replays_total", result="ok") >= 1
    assert rig.pool.workers.stats.skipped_parent == 0


async def test_gap_replays_missing_batch(
    rig: Rig, publishers: Any, vllm_kv: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    kv = vllm_kv
    a = publishers.start(topic=f"kv@x@{MODEL}")
    rig.pool.subscriptions.endpoint_added(endpoint("a", 8000, a))
    a.publish(batch(kv, stored(kv, [1, 2], None, TOKENS[: 2 * BS])))
    await until(lambda: rig.blocks(TOKENS, "127.0.0.1:8000") == 2)
    # the replay on connect must be over, or it could fetch the batch lost below before its successor shows the gap
    await until(lambda: rig.metric("kv_cache_events_replays_total", result="ok") == 1)
    # lose the next live message (as a full queue or HWM would); the one after reveals the gap
    real_submit = rig.pool.workers.submit
    lost: list[int] = []

    def lossy(frames: list[bytes], source: str | None, replay: str | None = None) -> bool:
        if not lost:
            lost.append(int.from_bytes(frames[1], "big"))
            return False
        return real_submit(frames, source, replay)

    monkeypatch.setattr(rig.pool.workers, "submit", lossy)
    a.publish(batch(kv, stored(kv, [3, 4], 2, TOKENS[2 * BS : 4 * BS])))
    await until(lambda: bool(lost))
    a.publish(batch(kv, stored(kv, [5, 6, 7, 8], 4, TOKENS[4 * BS :])))
    await until(lambda: rig.blocks(TOKENS, "127.0.0.1:8000") == 8)
    assert rig.metric("kv_cache_events_sequence_total", verdict="gap") == 1
    # counted when the END marker arrives, which may be after the replayed batches are applied
    await until(lambda: rig.metric("kv_cache_events_replays_total", result="ok") == 2)


async def test_publisher_restart_clears_pod(rig: Rig, publishers: Any, vllm_kv: Any) -> None:
    kv = vllm_kv
    a = publishers.start(topic=f"kv@x@{MODEL}")
    rig.pool.subscriptions.endpoint_added(endpoint("a", 8000, a))
    a.publish(batch(kv, stored(kv, [1, 2, 3, 4], None, TOKENS[: 4 * BS])))
    a.publish(batch(kv, stored(kv, [5, 6, 7, 8], 4, TOKENS[4 * BS :])))
    await until(lambda: rig.blocks(TOKENS, "127.0.0.1:8000") == 8)
    # the replay on connect must be over: one cut short by the restart would put the endpoint in its cooldown,
    # and the replay after the reconnect, which may be what detects the restart, would not run
    await until(lambda: rig.metric("kv_cache_events_replays_total", result="ok") == 1)
    a2 = await publishers.restart(a)
    other = list(range(5000, 5000 + 2 * BS))
    for _ in range(50):  # until the SUB has reconnected and sees the new stream
        a2.publish(batch(kv, stored(kv, [901, 902], None, other)))
        await asyncio.sleep(0.05)
        if rig.blocks(other, "127.0.0.1:8000") == 2:
            break
    await until(lambda: rig.blocks(other, "127.0.0.1:8000") == 2)
    # The restart is seen either live (seq back to 0) or, when the new stream's first batches were lost, by the
    # replay that follows the reconnect (the publisher's copy of our last pre-reconnect batch differs).
    await until(lambda: rig.blocks(TOKENS, "127.0.0.1:8000") == 0)
    await until(lambda: rig.blocks(other, "127.0.0.1:8000") == 2)  # refilled by the replay from 0 after the clear
    assert rig.metric("kv_cache_events_sequence_total", verdict="restart") >= 1


async def test_central_bind_mode_takes_pod_from_topic(publishers: Any, vllm_kv: Any) -> None:
    import socket

    import msgpack
    import zmq

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    kv = vllm_kv
    r = Rig(PoolConfig(zmq_endpoint=f"tcp://127.0.0.1:{port}", discover_pods=False, default_model=MODEL))
    task = asyncio.create_task(r.pool.run())
    forger: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.PUB)
    try:
        await r.pool.started()
        # vLLM connects its PUB (no '*' in the endpoint) to our bound SUB
        a = publishers.start(topic=f"kv@10.0.0.7:8000@{MODEL}", endpoint=f"tcp://127.0.0.1:{port}")
        # discovery still tells the pool where this pod's replay socket is
        r.pool.subscriptions.endpoint_added(
            Endpoint("p", "10.0.0.7", 8000, attributes=DataMap({REPLAY_ENDPOINT_ATTR: a.replay}))
        )
        await asyncio.sleep(0.3)
        a.publish(batch(kv, stored(kv, [1, 2, 3], None, TOKENS[: 3 * BS])))
        a.publish(batch(kv, stored(kv, [4], 3, TOKENS[3 * BS : 4 * BS])))
        await until(lambda: r.blocks(TOKENS, "10.0.0.7:8000") == 4)
        # Anyone reaching the socket can send any topic. A pod the pool does not have gets no state at all...
        forger.setsockopt(zmq.SNDHWM, 0)  # queue everything: no message lost on the way
        forger.connect(f"tcp://127.0.0.1:{port}")
        await asyncio.sleep(0.3)
        cleared = msgpack.packb([0.0, [["AllBlocksCleared"]]])
        for i in range(2000):
            forger.send_multipart([f"kv@10.9.{i // 256}.{i % 256}:8000@m".encode(), (0).to_bytes(8, "big"), cleared])
        # ...and a real pod's topic with a rewound seq (what a restart looks like) is checked against the pod's
        # publisher before anything is cleared: it did not restart, so the message is dropped.
        forger.send_multipart([f"kv@10.0.0.7:8000@{MODEL}".encode(), (0).to_bytes(8, "big"), cleared])
        await until(lambda: r.metric("kv_cache_events_dropped_total", reason="rewound") == 1)
        await until(lambda: r.metric("kv_cache_events_dropped_total", reason="unknown_pod") == 2000)
        assert r.blocks(TOKENS, "10.0.0.7:8000") == 4
        assert r.pool.workers.seq.ranks("10.0.0.7:8000") == [0] and len(r.pool.workers._shard_of) <= 1
        # A real restart (seq back to 0 from the same publisher) still clears and refills the pod.
        b = await publishers.restart(a)
        await asyncio.sleep(0.3)
        b.publish(batch(kv, stored(kv, [9], None, TOKENS[:BS])))
        await until(lambda: r.blocks(TOKENS, "10.0.0.7:8000") == 1)
        # A pod that leaves the pool stops being accepted.
        r.pool.subscriptions.endpoint_removed(Endpoint("p", "10.0.0.7", 8000))
        forger.send_multipart([f"kv@10.0.0.7:8000@{MODEL}".encode(), (5).to_bytes(8, "big"), cleared])
        await until(lambda: r.metric("kv_cache_events_dropped_total", reason="unknown_pod") == 2001)
    finally:
        forger.close(linger=0)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


RANK = 2  # a data-parallel rank other than 0: its batches say dp_rank 2 and have their own seq numbering


async def dp_rank_pod(rig: Rig, publishers: Any, links: list[TcpLink]) -> tuple[Any, TcpLink]:
    """A rank-2 vLLM publisher whose PUB our subscription reaches through a link we can cut."""
    pub = publishers.start(topic=f"kv@x@{MODEL}", rank=RANK)
    link = await TcpLink(pub.endpoint.removeprefix("tcp://")).start()
    links.append(link)
    rig.pool.subscriptions.endpoint_added(endpoint(f"a-rank-{RANK}", 8000 + RANK, pub, events=link.endpoint))
    return pub, link


def spy_replays(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, list[int]]]:
    """Record each replay request: its start seq and the seqs the publisher answered with."""
    calls: list[tuple[int, list[int]]] = []
    real = rig.pool.replayer.frames

    async def frames(endpoint: str, start: int) -> AsyncIterator[list[bytes]]:
        seqs: list[int] = []
        calls.append((start, seqs))
        async for f in real(endpoint, start):
            if len(f) == 3 and f[0]:
                seqs.append(int.from_bytes(f[1], "big"))
            yield f

    monkeypatch.setattr(rig.pool.replayer, "frames", frames)
    return calls


async def test_reconnect_of_a_dp_rank_replays_from_its_last_batch(
    rig: Rig, publishers: Any, vllm_kv: Any, links: list[TcpLink], monkeypatch: pytest.MonkeyPatch
) -> None:
    kv, pod = vllm_kv, f"127.0.0.1:{8000 + RANK}"
    pub, link = await dp_rank_pod(rig, publishers, links)
    parent = None
    for i in range(3):  # seqs 0..2, two chained blocks each
        pub.publish(batch(kv, stored(kv, [10 + 2 * i, 11 + 2 * i], parent, TOKENS[2 * i * BS : (2 * i + 2) * BS])))
        parent = 11 + 2 * i
    await until(lambda: rig.blocks(TOKENS, pod) == 6)
    await until(lambda: rig.metric("kv_cache_events_replays_total", result="ok") == 1)  # the replay on connect
    assert rig.pool.workers.seq.last(pod, RANK) == 2
    calls = spy_replays(rig, monkeypatch)
    await link.cut()  # the network drops: what the publisher sends now is lost on the PUB, kept in its buffer
    pub.publish(batch(kv, stored(kv, [16, 17], 15, TOKENS[6 * BS :])))
    await until(lambda: len(pub._buffer) == 4)
    await link.restore()
    await until(lambda: rig.blocks(TOKENS, pod) == 8)  # only the replay after the reconnect can bring seq 3
    # the request starts at our last batch of rank 2 (to check the publisher against it), not at 0
    assert calls == [(2, [2, 3])]
    assert rig.metric("kv_cache_events_sequence_total", verdict="restart") == 0


async def test_restarted_dp_rank_is_detected_on_reconnect(
    rig: Rig, publishers: Any, vllm_kv: Any, links: list[TcpLink]
) -> None:
    kv, pod = vllm_kv, f"127.0.0.1:{8000 + RANK}"
    pub, link = await dp_rank_pod(rig, publishers, links)
    pub.publish(batch(kv, stored(kv, [1, 2, 3, 4], None, TOKENS[: 4 * BS])))
    pub.publish(batch(kv, stored(kv, [5, 6, 7, 8], 4, TOKENS[4 * BS :])))
    await until(lambda: rig.blocks(TOKENS, pod) == 8)
    await until(lambda: rig.metric("kv_cache_events_replays_total", result="ok") == 1)
    await link.cut()
    # The engine restarts while we are cut off: seqs 0 and 1 again, other blocks, all lost on the PUB. Only the
    # replay after the reconnect can tell: the publisher's batch 1 is not the batch 1 we applied.
    pub2 = await publishers.restart(pub)
    other = list(range(5000, 5000 + 4 * BS))
    pub2.publish(batch(kv, stored(kv, [901, 902], None, other[: 2 * BS])))
    pub2.publish(batch(kv, stored(kv, [903, 904], 902, other[2 * BS :])))
    await until(lambda: len(pub2._buffer) == 2)
    await link.restore()
    await until(lambda: rig.blocks(TOKENS, pod) == 0)  # cleared
    await until(lambda: rig.blocks(other, pod) == 4)  # and refilled by the replay from 0
    assert rig.metric("kv_cache_events_sequence_total", verdict="restart") == 1
