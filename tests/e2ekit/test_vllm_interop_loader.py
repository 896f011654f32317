import msgspec

from e2e.vllm_interop import load_kv_events


def test_vllm_structs_load_without_torch() -> None:
    kv = load_kv_events()
    ev = kv.BlockStored(
        block_hashes=[1, 2],
        parent_block_hash=None,
        token_ids=list(range(32)),
        block_size=16,
        lora_id=None,
        medium="GPU",
        lora_name=None,
    )
    batch = kv.KVEventBatch(ts=1.0, events=[ev, kv.AllBlocksCleared()], data_parallel_rank=0)
    decoded = msgspec.msgpack.decode(msgspec.msgpack.encode(batch))
    assert decoded[0] == 1.0 and decoded[2] == 0
    assert hasattr(kv, "ZmqEventPublisher")
