"""Client-side helpers for tests: a ZMQ SUB that collects the simulator's KV-event frames, a replay client,
and decoders built on vLLM's own `vllm.distributed.kv_events` structs.

`decode_batch(payload, "map")` decodes with vLLM's `KVEventBatch` as is (vLLM ≥ #42892 tags events as maps).
For "array" it uses subclasses of vLLM's structs with `array_like=True` and the original tags, i.e. exactly
the pre-#42892 struct definitions (same fields, same order).
"""

import time
from dataclasses import dataclass
from typing import Any

import msgspec
import zmq

from e2e.vllm_interop import load_kv_events

_ARRAY_BATCH: Any = None


def _array_batch_type() -> Any:
    global _ARRAY_BATCH
    if _ARRAY_BATCH is None:
        kv: Any = load_kv_events()

        class BlockStored(kv.BlockStored, array_like=True, tag="BlockStored"):  # type: ignore[call-arg]
            pass

        class BlockRemoved(kv.BlockRemoved, array_like=True, tag="BlockRemoved"):  # type: ignore[call-arg]
            pass

        class AllBlocksCleared(kv.AllBlocksCleared, array_like=True, tag="AllBlocksCleared"):  # type: ignore[call-arg]
            pass

        class KVEventBatch(kv.EventBatch):
            events: list[BlockStored | BlockRemoved | AllBlocksCleared]

        _ARRAY_BATCH = KVEventBatch
    return _ARRAY_BATCH


def decode_batch(payload: bytes, encoding: str) -> Any:
    """The payload as a vLLM `KVEventBatch` (events are vLLM BlockStored/BlockRemoved/AllBlocksCleared)."""
    kv = load_kv_events()
    typ = kv.KVEventBatch if encoding == "map" else _array_batch_type()
    return msgspec.msgpack.decode(payload, type=typ)


@dataclass
class Frame:
    topic: bytes
    seq: int
    payload: bytes


class EventSubscriber:
    """A SUB socket connected to one simulator's PUB (topic filter `kv@`)."""

    def __init__(self, endpoint: str, topic: str = "kv@", bind: bool = False) -> None:
        self.sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.SUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt_string(zmq.SUBSCRIBE, topic)
        if bind:
            self.sock.bind(endpoint)
            self.endpoint: str = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        else:
            self.sock.connect(endpoint)
            self.endpoint = endpoint
        time.sleep(0.3)  # ZMQ slow joiner: let the subscription reach the publisher

    def recv(self, timeout: float = 5.0) -> Frame:
        if not self.sock.poll(int(timeout * 1000)):
            raise TimeoutError("no KV-event frame")
        frames = self.sock.recv_multipart()
        assert len(frames) == 3, f"expected 3 frames, got {len(frames)}"
        assert len(frames[1]) == 8
        return Frame(frames[0], int.from_bytes(frames[1], "big"), frames[2])

    def recv_idle(self, timeout: float) -> Frame | None:
        """Poll for up to `timeout` (a bound SUB only attaches connecting PUBs while it is inside a zmq call)."""
        try:
            return self.recv(timeout)
        except TimeoutError:
            return None

    def drain(self, quiet: float = 0.3) -> list[Frame]:
        """Every frame until none arrives for `quiet` seconds."""
        out: list[Frame] = []
        while True:
            try:
                out.append(self.recv(quiet))
            except TimeoutError:
                return out

    def close(self) -> None:
        self.sock.close(linger=0)


def replay(endpoint: str, start_seq: int, timeout: float = 5.0) -> list[Frame]:
    """Ask a replay ROUTER for batches from `start_seq` (DEALER `["", seq]`, like llm-d); ends at the -1 marker."""
    sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        sock.send_multipart([b"", start_seq.to_bytes(8, "big")])
        out: list[Frame] = []
        while True:
            if not sock.poll(int(timeout * 1000)):
                raise TimeoutError("replay: no end marker")
            frames = sock.recv_multipart()
            assert frames[0] == b"", frames
            topic, seq, payload = frames[1:]
            if int.from_bytes(seq, "big", signed=True) == -1:
                assert topic == b"" and payload == b""
                return out
            out.append(Frame(topic, int.from_bytes(seq, "big"), payload))
    finally:
        sock.close(linger=0)
