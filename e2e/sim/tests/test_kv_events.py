"""The simulator's KV events, decoded with vLLM's own structs, over real ZMQ sockets."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import msgpack
import msgspec
import pytest

from e2e.harness.ports import free_port_run
from e2e.sim.hashing import hash_block_tokens, none_hash, to_external
from e2e.sim.launch import Sim
from e2e.sim.publisher import offset_endpoint_port
from e2e.sim.testing import EventSubscriber, decode_batch, replay
from e2e.vllm_interop import load_kv_events
from epp.tokenization.qwen import load_qwen25_tokenizer

from .helpers import get, post

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
PROMPT = "The history of the Roman empire, told in many words. " * 12


@pytest.fixture(scope="module")
def tok() -> Any:
    return load_qwen25_tokenizer()


def _stored(batch: Any) -> list[Any]:
    kv = load_kv_events()
    return [e for e in batch.events if isinstance(e, kv.BlockStored)]


@pytest.mark.parametrize("encoding", ["array", "map"])
def test_block_stored_fields_with_vllm_structs(thread_sim_factory: Any, tok: Any, encoding: str) -> None:
    sim: Sim = thread_sim_factory("--kv-events-encoding", encoding, "--lora-modules", "sql-lora=/adapters/sql")
    sub = EventSubscriber(sim.event_endpoint or "")
    try:
        status, body = post(sim.url + "/v1/completions", {"model": MODEL, "prompt": PROMPT, "max_tokens": 2})
        assert status == 200
        frame = sub.recv()
        assert frame.topic == sim.topic.encode() == f"kv@{sim.hostport}@{MODEL}".encode()
        assert frame.seq == 0
        batch = decode_batch(frame.payload, encoding)
        assert batch.data_parallel_rank == 0
        ids = tok.encode(PROMPT)
        assert body["usage"]["prompt_tokens"] == len(ids)
        n = len(ids) // 16
        (ev,) = _stored(batch)
        assert ev.block_size == 16 and ev.parent_block_hash is None
        assert ev.token_ids == ids[: n * 16]
        assert ev.lora_id is None and ev.lora_name is None and ev.medium == "GPU"
        assert ev.extra_keys == [None] * n and ev.group_idx == 0
        assert ev.kv_cache_spec_kind == "full_attention"  # as vLLM annotates a group's stores (llm-d skips others)
        # engine hashes: vLLM's sha256_cbor chain, low 64 bits
        parent = none_hash()
        expect = []
        for i in range(n):
            parent = hash_block_tokens(parent, ids[i * 16 : (i + 1) * 16], None)
            expect.append(to_external(parent))
        assert ev.block_hashes == expect
        assert all(isinstance(h, int) and 0 <= h < 2**64 for h in ev.block_hashes)

        # the same prompt as a LoRA request: new hashes, lora fields and per-block extra keys
        status, _ = post(sim.url + "/v1/completions", {"model": "sql-lora", "prompt": PROMPT, "max_tokens": 2})
        assert status == 200
        (lev,) = _stored(decode_batch(sub.recv().payload, encoding))
        assert lev.lora_name == "sql-lora" and lev.lora_id == 1
        assert lev.extra_keys == [("sql-lora",)] * n
        assert not set(lev.block_hashes) & set(ev.block_hashes)

        # a longer prompt sharing the prefix: only the new blocks, parented on the last cached one
        longer = PROMPT + "And then the story of Byzantium, again at length. " * 4
        status, body = post(sim.url + "/v1/completions", {"model": MODEL, "prompt": longer, "max_tokens": 2})
        assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == n * 16
        (ext,) = _stored(decode_batch(sub.recv().payload, encoding))
        assert ext.parent_block_hash == ev.block_hashes[-1]
        lids = tok.encode(longer)
        assert ext.token_ids == lids[n * 16 : (len(lids) // 16) * 16]
    finally:
        sub.close()


def test_wire_bytes_equal_vllm_encoder(thread_sim_factory: Any) -> None:
    """Re-encoding the decoded batch with vLLM's msgspec structs gives the same msgpack value (both encodings):
    same positional layout, same omitted defaults, same keys."""
    for encoding in ("map", "array"):
        sim: Sim = thread_sim_factory("--kv-events-encoding", encoding, "--num-gpu-blocks", "12", events=True)
        sub = EventSubscriber(sim.event_endpoint or "")
        try:
            for i in range(3):  # 3 x 5 blocks > 12: eviction happens
                post(sim.url + "/v1/completions", {"prompt": f"{i} " + PROMPT[:300], "max_tokens": 1})
            post(sim.url + "/reset_prefix_cache", {})
            frames = sub.drain()
            kinds = set()
            for f in frames:
                batch = decode_batch(f.payload, encoding)
                kinds |= {type(e).__name__ for e in batch.events}
                ours, theirs = msgpack.unpackb(f.payload), msgpack.unpackb(msgspec.msgpack.encode(batch))
                if encoding == "array":  # vLLM 0.34 has grown fields after the last array_like release's
                    for mine, vllm in zip(ours[1], theirs[1], strict=True):
                        assert vllm[: len(mine)] == mine and all(v is None for v in vllm[len(mine) :])
                    ours[1] = theirs[1]
                assert ours == theirs
            assert kinds == {"BlockStored", "BlockRemoved", "AllBlocksCleared"}
        finally:
            sub.close()


def test_eviction_under_capacity_pressure(thread_sim_factory: Any) -> None:
    sim: Sim = thread_sim_factory("--num-gpu-blocks", "20")
    sub = EventSubscriber(sim.event_endpoint or "")
    kv = load_kv_events()
    try:
        stored: list[int] = []
        removed: list[int] = []
        for i in range(6):
            status, _ = post(sim.url + "/v1/completions", {"prompt": f"document {i}: " + PROMPT, "max_tokens": 4})
            assert status == 200
        for f in sub.drain():
            for e in decode_batch(f.payload, "array").events:
                if isinstance(e, kv.BlockStored):
                    stored += e.block_hashes
                elif isinstance(e, kv.BlockRemoved):
                    assert e.medium == "GPU" and e.group_idx == 0 and len(e.block_hashes) == 1
                    removed += e.block_hashes
        assert removed, "no BlockRemoved although the cache overflowed"
        assert set(removed) <= set(stored)
        # what is still cached fits in the capacity, and the oldest prompt's blocks went first (LRU)
        assert len(set(stored) - set(removed)) <= 20
        first_doc = stored[: len(stored) // 6]
        assert set(first_doc) <= set(removed)
    finally:
        sub.close()


def test_reset_prefix_cache_emits_all_blocks_cleared(sim: Sim) -> None:
    kv = load_kv_events()
    sub = EventSubscriber(sim.event_endpoint or "")
    try:
        post(sim.url + "/v1/completions", {"prompt": PROMPT, "max_tokens": 1})
        status, _ = post(sim.url + "/reset_prefix_cache", {})
        assert status == 200
        events = [e for f in sub.drain() for e in decode_batch(f.payload, "array").events]
        assert isinstance(events[-1], kv.AllBlocksCleared)
        # the cache is really empty: the same prompt is a miss again
        _, body = post(sim.url + "/v1/completions", {"prompt": PROMPT, "max_tokens": 1})
        assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    finally:
        sub.close()


@pytest.fixture
def lossy_sim(thread_sim_factory: Any) -> Iterator[Sim]:
    yield thread_sim_factory("--kv-events-buffer-steps", "100")


def test_replay_fills_a_gap_and_ends_with_marker(lossy_sim: Sim) -> None:
    sim = lossy_sim
    sub = EventSubscriber(sim.event_endpoint or "")
    try:
        post(sim.url + "/v1/completions", {"prompt": "a " + PROMPT, "max_tokens": 1})
        assert sub.recv().seq == 0
        post(sim.url + "/admin/events", {"mode": "lossy"})  # batches numbered and buffered, but not sent
        post(sim.url + "/v1/completions", {"prompt": "b " + PROMPT, "max_tokens": 1})
        post(sim.url + "/v1/completions", {"prompt": "c " + PROMPT, "max_tokens": 1})
        assert sub.drain() == []
        post(sim.url + "/admin/events", {"mode": "on"})
        post(sim.url + "/v1/completions", {"prompt": "d " + PROMPT, "max_tokens": 1})
        live = sub.recv()
        assert live.seq == 3  # the subscriber sees the gap 1..2
        got = replay(sim.replay_endpoint or "", 1)
        assert [f.seq for f in got] == [1, 2, 3]
        assert all(f.topic == sim.topic.encode() for f in got)
        assert got[-1].payload == live.payload
        stored = [e for f in got[:2] for e in _stored(decode_batch(f.payload, "array"))]
        assert len(stored) == 2
        assert [f.seq for f in replay(sim.replay_endpoint or "", 0)] == [0, 1, 2, 3]
        assert replay(sim.replay_endpoint or "", 4) == []  # nothing newer: only the end marker
    finally:
        sub.close()


def test_publisher_restart_resets_sequence(sim: Sim) -> None:
    sub = EventSubscriber(sim.event_endpoint or "")
    try:
        for p in ("x", "y"):
            post(sim.url + "/v1/completions", {"prompt": p + PROMPT, "max_tokens": 1})
        assert [f.seq for f in sub.drain()] == [0, 1]
        status, state = post(sim.url + "/admin/events", {"restart": True})
        assert status == 200 and state["events"]["next_seq"] == 0
        sub.close()
        sub = EventSubscriber(sim.event_endpoint or "")  # same port after the restart
        post(sim.url + "/v1/completions", {"prompt": "z" + PROMPT, "max_tokens": 1})
        assert sub.recv().seq == 0
        assert [f.seq for f in replay(sim.replay_endpoint or "", 0)] == [0]
    finally:
        sub.close()


def test_events_off_publishes_nothing(sim: Sim) -> None:
    sub = EventSubscriber(sim.event_endpoint or "")
    try:
        post(sim.url + "/admin/events", {"mode": "off"})
        post(sim.url + "/v1/completions", {"prompt": PROMPT, "max_tokens": 1})
        assert sub.drain() == []
        assert replay(sim.replay_endpoint or "", 0) == []
    finally:
        sub.close()


def test_data_parallel_rank_offsets_ports_like_vllm(thread_sim_factory: Any) -> None:
    kv = load_kv_events()
    for ep in ("tcp://*:5557", "tcp://10.0.0.1:6000", "tcp://*:0", "inproc://cache", None):
        for rank in (0, 1, 3):
            assert offset_endpoint_port(ep, rank) == kv.ZmqEventPublisher.offset_endpoint_port(ep, rank)
    sim: Sim = thread_sim_factory("--data-parallel-rank", "2")
    sub = EventSubscriber(sim.event_endpoint or "")
    try:
        post(sim.url + "/v1/completions", {"prompt": PROMPT, "max_tokens": 1})
        assert decode_batch(sub.recv().payload, "array").data_parallel_rank == 2
    finally:
        sub.close()


def test_connect_mode_publishes_to_a_central_sub(thread_sim_factory: Any) -> None:
    """llm-d's centralized topology: the EPP binds a SUB, the engine's PUB connects to it."""
    central = EventSubscriber("tcp://127.0.0.1:*", bind=True)
    try:
        sim: Sim = thread_sim_factory(events=False, replay=False, connect_events=central.endpoint)
        assert central.recv_idle(0.3) is None  # a bound SUB attaches new peers only while it polls
        post(sim.url + "/v1/completions", {"prompt": PROMPT, "max_tokens": 1})
        frame = central.recv()
        assert frame.topic == sim.topic.encode()
    finally:
        central.close()


def test_data_parallel_engines_publish_on_port_plus_rank(thread_sim_factory: Any) -> None:
    pub, rep = free_port_run(2), free_port_run(2)
    sim: Sim = thread_sim_factory(
        "--data-parallel-size", "2", "--kv-events-endpoint", f"tcp://*:{pub}",
        "--kv-events-replay-endpoint", f"tcp://*:{rep}", events=False,
    )  # fmt: skip
    assert sim.event_endpoints == [f"tcp://127.0.0.1:{pub}", f"tcp://127.0.0.1:{pub + 1}"]
    assert sim.replay_endpoints == [f"tcp://127.0.0.1:{rep}", f"tcp://127.0.0.1:{rep + 1}"]
    subs = [EventSubscriber(ep) for ep in sim.event_endpoints]
    try:
        # pinned by vLLM's X-data-parallel-rank header: each rank's events carry its rank, same topic
        for rank in (1, 0):
            import urllib.request

            req = urllib.request.Request(
                sim.url + "/v1/completions", data=json.dumps({"prompt": PROMPT, "max_tokens": 1}).encode(),
                headers={"Content-Type": "application/json", "X-data-parallel-rank": str(rank)},
            )  # fmt: skip
            with urllib.request.urlopen(req) as r:
                assert json.loads(r.read())["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # own cache
            frame = subs[rank].recv()
            assert frame.topic == sim.topic.encode() and frame.seq == 0
            assert decode_batch(frame.payload, "array").data_parallel_rank == rank
            assert [f.seq for f in replay(sim.replay_endpoints[rank], 0)] == [0]
        assert all(s.drain(0.2) == [] for s in subs)
        m = get(sim.url + "/metrics")[1]
        assert 'engine="1"' in m and 'engine="0"' in m
    finally:
        for s in subs:
            s.close()


def test_data_parallel_balancing_and_bad_rank(thread_sim_factory: Any) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from .test_metrics import wait_for

    sim: Sim = thread_sim_factory("--data-parallel-size", "2", "--inter-token-latency", "0.03", events=False)
    with ThreadPoolExecutor(2) as pool:
        futs = [pool.submit(post, sim.url + "/v1/completions", {"prompt": "hi", "max_tokens": 30}) for _ in range(2)]
        wait_for(lambda: [e["running"] for e in post(sim.url + "/admin/config", {})[1]["engines"]] == [1, 1])
        assert all(f.result()[0] == 200 for f in futs)
    req_status, err = _post_with_header(sim.url + "/v1/completions", {"prompt": "hi"}, {"X-data-parallel-rank": "7"})
    assert req_status == 400 and "X-data-parallel-rank" in err["error"]["message"]


def _post_with_header(url: str, body: Any, headers: dict[str, str]) -> tuple[int, Any]:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json", **headers}
    )
    try:
        with urllib.request.urlopen(req) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_bytes_block_hashes_when_int_mode_is_off(thread_sim_factory: Any, tok: Any) -> None:
    """VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0: events carry the 32-byte sha256 hashes (ExternalBlockHash = bytes)."""
    sim: Sim = thread_sim_factory("--block-hash-format", "bytes", "--kv-events-encoding", "map")
    sub = EventSubscriber(sim.event_endpoint or "")
    try:
        post(sim.url + "/v1/completions", {"prompt": PROMPT, "max_tokens": 1})
        (ev,) = _stored(decode_batch(sub.recv().payload, "map"))
        ids = tok.encode(PROMPT)
        first = hash_block_tokens(none_hash(), ids[:16], None)
        assert ev.block_hashes[0] == first and all(isinstance(h, bytes) and len(h) == 32 for h in ev.block_hashes)
        assert ev.parent_block_hash is None
    finally:
        sub.close()
