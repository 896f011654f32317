"""Settings of the KV-event pool, from llm-d's `kvEventsConfig` (shared by subscriptions, replay and workers)."""

from __future__ import annotations

from dataclasses import dataclass

from epp.framework.params import Params


@dataclass
class PoolConfig:
    zmq_endpoint: str | None = None  # central-bind mode, e.g. tcp://*:5557
    topic_filter: str = "kv@"
    concurrency: int = 4
    engine_type: str = "vllm"  # "vllm" | "sglang" (same decoder; SGLang replays [seq, payload])
    discover_pods: bool = True
    socket_port: int = 5557
    replay_port: int | None = None
    queue_size: int = 10_000  # per shard
    default_model: str = ""  # model for topics that do not name one
    replay_idle_timeout: float = 2.0
    replay_timeout: float = 60.0
    replay_cooldown: float = 30.0  # after a failed replay, no replays from that endpoint for this long
    max_concurrent_replays: int = 8
    retry_interval: float = 5.0
    # pyepp's: bytes a ZMQ message may have (larger ones are refused by ZMQ, which drops the peer's connection; a
    # 131,072-block batch with its token ids is ~9 MiB), and bytes of payloads queued for the workers at once.
    max_message_bytes: int = 64 * 1024 * 1024
    max_queued_bytes: int = 256 * 1024 * 1024
    # pyepp's per-pod budgets on what its events may store (epp.kvcache.validation)
    max_blocks_per_pod: int = 1 << 21
    max_blocks_per_second: int = 65_536

    @classmethod
    def from_params(cls, p: Params) -> PoolConfig:
        """llm-d's kvEventsConfig keys (podDiscoveryConfig nested or flat)."""
        disc = p.section("podDiscoveryConfig")

        def port(*keys: str) -> int | None:
            for src in (disc, p):
                for k in keys:
                    if src.has(k):
                        return src.int(k, 0, min=0, max=65535)
            return None

        replay = port("replaySocketPort", "kvEventsReplayPort")
        return cls(
            zmq_endpoint=p.optional_str("zmqEndpoint") or None,
            topic_filter=p.str("topicFilter", "kv@"),
            concurrency=p.int("concurrency", 4, min=1, max=1024),
            engine_type=p.str("engineType", "vllm").lower(),
            discover_pods=p.bool("discoverPods", True),
            socket_port=port("socketPort", "kvEventsPort") or 5557,
            replay_port=replay,
            queue_size=p.int("queueSize", 10_000, min=1, max=10_000_000),
            default_model=p.optional_str("modelName") or p.str("defaultModel", ""),
            max_message_bytes=p.int("maxMessageBytes", 64 * 1024 * 1024, min=1024),
            max_queued_bytes=p.int("maxQueuedBytes", 256 * 1024 * 1024, min=1024),
            max_blocks_per_pod=p.int("maxBlocksPerPod", 1 << 21, min=1),
            max_blocks_per_second=p.int("maxBlocksPerSecond", 65_536, min=1),
        )
