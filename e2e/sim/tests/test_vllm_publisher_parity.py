"""Our publisher against vLLM's own `ZmqEventPublisher`: same live frames, same replay replies and end marker."""

from __future__ import annotations

import socket
import time
import types
from typing import Any

import zmq

from e2e.sim.launch import Sim
from e2e.sim.testing import EventSubscriber
from e2e.vllm_interop import load_kv_events

from .helpers import post


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = int(s.getsockname()[1])
    s.close()
    return port


def _raw_replay(endpoint: str, start: int) -> list[list[bytes]]:
    sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        sock.send_multipart([b"", start.to_bytes(8, "big")])
        out = []
        while sock.poll(3000):
            frames = sock.recv_multipart()
            out.append(frames)
            if frames[2] == (-1).to_bytes(8, "big", signed=True):
                break
        return out
    finally:
        sock.close(linger=0)


def _shape(frames: list[bytes], topic: bytes) -> list[Any]:
    """Frames with the topic and payload abstracted, everything else (empty delimiters, seq bytes) exact."""
    return ["TOPIC" if f == topic and f else ("PAYLOAD" if len(f) > 8 else f) for f in frames]


def test_live_and_replay_frames_match_vllms_publisher(sim: Sim, monkeypatch: Any) -> None:
    kv = load_kv_events()
    monkeypatch.setattr(kv, "KVEventsConfig", lambda **kw: types.SimpleNamespace(**kw))  # stubbed by the loader
    port, rport = _free_port(), _free_port()
    vllm_pub = kv.ZmqEventPublisher(0, endpoint=f"tcp://*:{port}", replay_endpoint=f"tcp://*:{rport}", topic=sim.topic)
    vsub = EventSubscriber(f"tcp://127.0.0.1:{port}")
    osub = EventSubscriber(sim.event_endpoint or "")
    try:
        ev = kv.BlockStored(
            block_hashes=[7], parent_block_hash=None, token_ids=list(range(16)), block_size=16,
            lora_id=None, medium="GPU", lora_name=None,
        )  # fmt: skip
        vllm_pub.publish(kv.KVEventBatch(ts=time.time(), events=[ev]))
        post(sim.url + "/v1/completions", {"prompt": "hello " * 40, "max_tokens": 1})
        v_live, o_live = vsub.recv(), osub.recv()
        assert (v_live.topic, v_live.seq) == (o_live.topic, o_live.seq) == (sim.topic.encode(), 0)
        v_rep = _raw_replay(f"tcp://127.0.0.1:{rport}", 0)
        o_rep = _raw_replay(sim.replay_endpoint or "", 0)
        topic = sim.topic.encode()
        assert [_shape(f, topic) for f in v_rep] == [_shape(f, topic) for f in o_rep]
        assert [_shape(f, topic) for f in o_rep] == [
            [b"", "TOPIC", (0).to_bytes(8, "big"), "PAYLOAD"],
            [b"", b"", b"\xff" * 8, b""],
        ]
        # a start past the end: only the marker, from both
        assert _raw_replay(f"tcp://127.0.0.1:{rport}", 5) == _raw_replay(sim.replay_endpoint or "", 5)
    finally:
        vsub.close()
        osub.close()
        vllm_pub.shutdown()
