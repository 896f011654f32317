"""Wire decoding (vLLM positional and map events, list and dict batches, SGLang) and frame validation."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import msgpack
import msgspec
import pytest
from prometheus_client import CollectorRegistry

from epp.kvcache.config import PoolConfig
from epp.kvcache.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    DecodeError,
    EventBatch,
    decode_batch,
    parse_topic,
)
from epp.kvcache.index import MemoryIndex
from epp.kvcache.ingest import EventApplier, realign_extra
from epp.kvcache.metrics import PoolMetrics
from epp.kvcache.pool import EventPool
from epp.kvcache.replay import Replayer
from epp.kvcache.sequencing import SequenceTracker, Verdict
from epp.kvcache.tokens import TokenProcessor, request_extra_keys
from epp.kvcache.workers import ShardedWorkers


def test_vllm_034_map_events_in_array_batch(vllm_kv: Any) -> None:
    kv = vllm_kv
    ev = kv.BlockStored(
        block_hashes=[1, (1 << 64) - 1],
        parent_block_hash=b"\x00" * 24 + (7).to_bytes(8, "big"),
        token_ids=list(range(32)),
        block_size=16,
        lora_id=None,
        medium="CPU",
        lora_name="adapter",
        extra_keys=[("adapter", ("mm1", 0), "salt"), None],
        group_idx=0,
        kv_cache_spec_kind="full_attention",
    )
    raw = msgspec.msgpack.encode(
        kv.KVEventBatch(ts=1.5, events=[ev, kv.BlockRemoved(block_hashes=[1], medium=None), kv.AllBlocksCleared()])
    )
    b = decode_batch(raw)
    s = b.events[0]
    assert isinstance(s, BlockStored)
    assert s.block_hashes == [1, (1 << 64) - 1] and s.parent == 7 and s.medium == "CPU"
    assert s.lora_name == "adapter" and s.group_idx == 0 and s.spec_kind == "full_attention"
    assert isinstance(b.events[1], BlockRemoved) and isinstance(b.events[2], AllBlocksCleared)
    assert b.ts == 1.5


def test_positional_events_dict_batch_and_sglang() -> None:
    old = msgpack.packb(
        {
            "ts": 2,
            "events": [["BlockStored", [5], None, [1, 2], 2, None, "GPU"], ["BlockRemoved", [5]]],
            "data_parallel_rank": 3,
        }
    )
    b = decode_batch(old)
    assert b.dp_rank == 3 and isinstance(b.events[0], BlockStored) and b.events[0].lora_name is None
    sglang = msgpack.packb([1.0, [["BlockStored", [9], 8, [1, 2, 3, 4], 4, None], ["AllBlocksCleared"]]])
    b = decode_batch(sglang)
    first = b.events[0]
    assert b.dp_rank is None and isinstance(first, BlockStored) and first.parent == 8
    assert isinstance(b.events[1], AllBlocksCleared)


def test_negative_int64_hash_is_masked() -> None:
    b = decode_batch(msgpack.packb([0, [["BlockRemoved", [-1]]]]))
    ev = b.events[0]
    assert isinstance(ev, BlockRemoved) and ev.block_hashes == [(1 << 64) - 1]


@pytest.mark.parametrize(
    "payload",
    [
        b"\xc1garbage",
        msgpack.packb("x"),
        msgpack.packb([1.0]),
        msgpack.packb([1.0, "notalist"]),
        msgpack.packb([1.0, [["BlockStored", [1], None]]]),  # too short
        msgpack.packb([1.0, [["BlockStored", [1], None, [1], 0]]]),  # block_size 0
        msgpack.packb([1.0, [["BlockStored", "x", None, [1], 16]]]),
        msgpack.packb([1.0, [{"type": "BlockRemoved"}]]),
        msgpack.packb([1.0, [{"block_hashes": [1]}]]),
        msgpack.packb([1.0, [["BlockRemoved", [1.5]]]]),
        msgpack.packb([1.0, [42]]),
    ],
)
def test_malformed_batches_raise_decode_error(payload: bytes) -> None:
    with pytest.raises(DecodeError):
        decode_batch(payload)


def test_unknown_event_tags_are_counted_not_fatal() -> None:
    b = decode_batch(msgpack.packb([1.0, [["BlocksMoved", 1], {"type": "Future"}, ["AllBlocksCleared"]]]))
    assert b.unknown == 2 and len(b.events) == 1


def test_topic() -> None:
    assert parse_topic(b"kv@10.0.0.1:8000@Qwen/Qwen3-32B") == ("10.0.0.1:8000", "Qwen/Qwen3-32B")
    assert parse_topic(b"kv@pod@model@with@ats") == ("pod", "model@with@ats")
    assert parse_topic(b"kv-events") == ("", "")


async def test_frames_are_validated_and_bad_payloads_do_not_stop_the_pool() -> None:
    reg = CollectorRegistry()
    idx = MemoryIndex()
    tp = TokenProcessor(2)
    pool = EventPool(EventApplier(idx, tp), PoolConfig(concurrency=1), PoolMetrics(reg))
    task = asyncio.create_task(pool.run())
    await pool.started()
    good = msgpack.packb([time.time(), [["BlockStored", [5], None, [1, 2], 2, None, "GPU"]]])
    assert not pool.workers.submit([b"kv@p@m", b"\x00" * 8], None)
    assert not pool.workers.submit([b"kv@p@m", b"\x00" * 4, good], None)
    assert not pool.workers.submit([b"kv", b"\x00" * 8, good], None)  # no pod in the topic
    assert pool.workers.submit([b"kv@p@m", (0).to_bytes(8, "big"), b"\xc1"], None)
    assert pool.workers.submit([b"kv@p@m", (1).to_bytes(8, "big"), good], None)
    await pool.drain()
    assert idx.lookup_now(tp.block_keys([1, 2], "m"))["p"].blocks == 1
    assert reg.get_sample_value("kv_cache_events_decode_errors_total") == 1
    assert reg.get_sample_value("kv_cache_events_zmq_errors_total", {"kind": "frames"}) == 1
    assert reg.get_sample_value("kv_cache_events_zmq_errors_total", {"kind": "seq"}) == 1
    task.cancel()


async def test_full_queue_drops_and_counts() -> None:
    reg = CollectorRegistry()
    pool = ShardedWorkers(
        EventApplier(MemoryIndex(), TokenProcessor(2)), PoolConfig(concurrency=1, queue_size=2), PoolMetrics(reg)
    )
    frames = [b"kv@p@m", (0).to_bytes(8, "big"), msgpack.packb([0, []])]
    results = [pool.submit(frames, None) for _ in range(5)]  # no worker running
    assert results == [True, True, False, False, False]
    assert reg.get_sample_value("kv_cache_events_dropped_total", {"reason": "queue_full"}) == 3
    assert reg.get_sample_value("kv_cache_events_pool_queue_depth") == 2


def test_sequence_verdicts() -> None:
    t = SequenceTracker()
    assert t.check("p", 0, 5) is Verdict.JOIN
    t.applied("p", 0, 5)
    assert t.check("p", 0, 6) is Verdict.APPLY
    t.applied("p", 0, 6)
    assert t.check("p", 0, 9) is Verdict.GAP
    t.applied("p", 0, 9)
    assert t.check("p", 0, 9) is Verdict.DUPLICATE
    assert t.check("p", 0, 2) is Verdict.RESTART
    assert t.check("p", 1, 0) is Verdict.APPLY  # ranks are independent
    t.applied("p", 0, 12)  # a replay ran ahead of the live stream
    assert t.check("p", 0, 11) is Verdict.DUPLICATE


def test_block_keys() -> None:
    tp = TokenProcessor(4, "s")
    k = tp.block_keys(list(range(10)), "m")
    assert len(k) == 2  # the partial trailing block is dropped
    assert tp.block_keys(list(range(8)), "m") == k
    assert tp.block_keys(list(range(8)), "other") != k  # the model is in the root
    assert TokenProcessor(4, "t").block_keys(list(range(8)), "m") != k  # so is the seed
    assert tp.block_keys(list(range(4, 8)), "m", parent=k[0]) == k[1:]  # chained
    assert tp.block_keys(list(range(8)), "m", block_size=2)[1] != k[0]
    salted = tp.block_keys(list(range(8)), "m", extra=request_extra_keys(2, 4, "salt"))
    assert salted[0] != k[0] and salted[1] != k[1]
    assert all(0 <= x < 1 << 64 for x in k)


def test_extra_keys_layout_and_realignment() -> None:
    assert request_extra_keys(3, 4, "salt", [("img", 2, 4)]) == [["img", "salt"], ["img"], None]
    assert realign_extra([["a"], None], 2) == [["a"], None]
    assert realign_extra([["a"]], 4) == [["a"], ["a"], ["a"], ["a"]]  # 1:many replicates
    assert realign_extra([["a"], ["b"], None, ["a"]], 1) == [["a", "b"]]  # many:1 unions


def test_engine_extra_keys_match_request_side(vllm_kv: Any) -> None:
    """vLLM puts cache_salt (and the LoRA name first) in block 0's extra_keys; our request keys agree."""
    kv = vllm_kv
    tp = TokenProcessor(4)
    idx = MemoryIndex()
    toks = list(range(100, 112))
    ev = kv.BlockStored(
        block_hashes=[1, 2, 3],
        parent_block_hash=None,
        token_ids=toks,
        block_size=4,
        lora_id=None,
        medium=None,
        lora_name="adapter-1",
        extra_keys=[("adapter-1", "tenant-a"), ("adapter-1",), None],
    )
    EventApplier(idx, tp).apply("p", "base", decode_batch(msgspec.msgpack.encode(kv.KVEventBatch(ts=0, events=[ev]))))
    want = tp.block_keys(toks, "adapter-1", extra=request_extra_keys(3, 4, "tenant-a"))
    assert idx.lookup_now(want)["p"].blocks == 3
    assert "p" not in idx.lookup_now(tp.block_keys(toks, "adapter-1"))  # unsalted request: miss


def test_hybrid_attention_groups_only_full_attention_indexed() -> None:
    tp = TokenProcessor(2)
    idx = MemoryIndex()
    ap = EventApplier(idx, tp)
    full = ["BlockStored", [1, 2], None, [1, 2, 3, 4], 2, None, "GPU", None, None, 0, "full_attention"]
    swa = ["BlockStored", [11, 12], None, [1, 2, 3, 4], 2, None, "GPU", None, None, 1, "sliding_window"]
    st = ap.apply("p", "m", decode_batch(msgpack.packb([0, [full, swa]])))
    assert st.stored_blocks == 2 and st.skipped_group == 1
    st = ap.apply("p", "m", decode_batch(msgpack.packb([0, [["BlockRemoved", [11], "GPU", 1]]])))
    assert st.skipped_group == 1 and idx.lookup_now(tp.block_keys([1, 2, 3, 4], "m"))["p"].blocks == 2


async def test_sglang_two_frame_replay_is_accepted() -> None:
    """SGLang's ROUTER replays [seq, payload] (no topic frame); a gap is still repaired."""

    class SGLangReplayer(Replayer):
        buffer: list[tuple[int, bytes]] = []

        async def frames(self, endpoint: str, start: int) -> Any:
            for s, p in self.buffer:
                if s >= start:
                    yield [s.to_bytes(8, "big"), p]
            yield [(-1).to_bytes(8, "big", signed=True), b""]

    tp = TokenProcessor(2)
    idx = MemoryIndex()
    pool = ShardedWorkers(EventApplier(idx, tp), PoolConfig(engine_type="sglang"), PoolMetrics(CollectorRegistry()))
    pool.replayer = SGLangReplayer(pool.cfg, pool.seq, pool, pool.metrics)
    b0 = msgpack.packb([0.0, [["BlockStored", [1], None, [1, 2], 2, None]]])
    b1 = msgpack.packb([1.0, [["BlockStored", [2], 1, [3, 4], 2, None]]])
    b2 = msgpack.packb([2.0, [["BlockStored", [3], 2, [5, 6], 2, None]]])
    SGLangReplayer.buffer = [(0, b0), (1, b1), (2, b2)]
    await pool.process("p", "m", 0, b0, "sim://p")
    await pool.process("p", "m", 2, b2, "sim://p")  # seq 1 was lost
    assert idx.lookup_now(tp.block_keys([1, 2, 3, 4, 5, 6], "m"))["p"].blocks == 3


async def test_bad_event_is_skipped_and_dead_replay_endpoint_cools_down() -> None:
    reg = CollectorRegistry()
    tp = TokenProcessor(2)
    idx = MemoryIndex()
    cfg = PoolConfig(replay_idle_timeout=0.2, replay_cooldown=30.0)
    pool = ShardedWorkers(EventApplier(idx, tp), cfg, PoolMetrics(reg))
    bad = ["BlockStored", [9], None, [1, -5], 2, None]  # a token id no tokenizer produces
    good = ["BlockStored", [1], None, [1, 2], 2, None]
    await pool.process("p", "m", 0, msgpack.packb([0.0, [bad, good]]), None)
    assert idx.lookup_now(tp.block_keys([1, 2], "m"))["p"].blocks == 1
    assert reg.get_sample_value("kv_cache_events_skipped_total", {"reason": "bad_event"}) == 1
    port = 1  # nothing listens there: the replay times out once, then is skipped during the cooldown
    dead = f"tcp://127.0.0.1:{port}"
    t = time.monotonic()
    await pool.process("p", "m", 5, msgpack.packb([1.0, []]), dead)
    await pool.process("p", "m", 9, msgpack.packb([2.0, []]), dead)
    assert time.monotonic() - t < 2.0
    assert reg.get_sample_value("kv_cache_events_replays_total", {"result": "timeout"}) == 1
    assert reg.get_sample_value("kv_cache_events_replays_total", {"result": "cooldown"}) == 1
    assert pool.seq.last("p", 0) == 9  # the stream goes on


async def test_undecodable_batch_of_a_dp_rank_is_filed_under_that_rank() -> None:
    """A rank-3 publisher's bad payload still takes seq 1 of rank 3: no phantom rank 0, no gap at seq 2."""
    reg = CollectorRegistry()
    pool = ShardedWorkers(EventApplier(MemoryIndex(), TokenProcessor(2)), PoolConfig(), PoolMetrics(reg))
    await pool.process("p", "m", 0, msgpack.packb([0.0, [], 3]), None)
    await pool.process("p", "m", 1, b"\xc1", None)
    await pool.process("p", "m", 2, msgpack.packb([2.0, [], 3]), None)
    assert pool.seq.ranks("p") == [3] and pool.seq.last("p", 3) == 2
    assert reg.get_sample_value("kv_cache_events_sequence_total", {"verdict": "gap"}) is None


def test_malformed_messages_are_counted_exactly_and_logged_rate_limited(caplog: pytest.LogCaptureFixture) -> None:
    reg = CollectorRegistry()
    pool = ShardedWorkers(EventApplier(MemoryIndex(), TokenProcessor(2)), PoolConfig(concurrency=1), PoolMetrics(reg))
    with caplog.at_level(logging.WARNING, "epp.kvcache.workers"):
        for _ in range(5000):
            assert not pool.submit([b"kv@p@m", b"\x00" * 8], None)
            assert not pool.submit([b"kv@p@m", b"\x00", b""], None)
    assert reg.get_sample_value("kv_cache_events_zmq_errors_total", {"kind": "frames"}) == 5000
    assert reg.get_sample_value("kv_cache_events_zmq_errors_total", {"kind": "seq"}) == 5000
    assert len(caplog.records) <= 4  # was one WARNING per message


@pytest.mark.parametrize("engine_bs", [4, 8])
def test_sliced_batches_index_exactly_like_the_whole_batch(engine_bs: int) -> None:
    """A huge batch is applied in slices (the event loop runs between them); the index ends up the same."""
    from epp.kvcache.ingest import slice_batch

    n = 50
    tokens = list(range(1000, 1000 + n * engine_bs))
    stored = BlockStored(list(range(1, n + 1)), None, tokens, engine_bs, extra_keys=[None] * n)
    more = BlockStored([900, 901], n, list(range(7, 7 + 2 * engine_bs)), engine_bs)
    removed = BlockRemoved(list(range(40, 46)))
    batch = EventBatch(0.0, [stored, more, removed], unknown=2)
    parts = list(slice_batch(batch, 7))
    assert len(parts) > 8 and all(sum(len(getattr(e, "block_hashes", ())) for e in p.events) <= 7 for p in parts)
    assert sum(p.unknown for p in parts) == 2
    results = []
    for pieces in ([batch], parts):
        tp = TokenProcessor(4)
        idx = MemoryIndex()
        applier = EventApplier(idx, tp)
        st = [applier.apply("p", "m", b) for b in pieces]
        assert sum(s.stored_blocks for s in st) == n + 2 and sum(s.removed_blocks for s in st) == 6
        whole = idx.lookup_now(tp.block_keys(tokens, "m"))["p"].blocks
        tail = idx.lookup_now(tp.block_keys(tokens + list(range(7, 7 + 2 * engine_bs)), "m"))["p"].blocks
        results.append((whole, tail))
    assert results[0] == results[1] and results[0][0] == 39 * engine_bs // 4  # removal at block 40 cuts the prefix
