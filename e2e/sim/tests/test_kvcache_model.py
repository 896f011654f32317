"""The KV-cache model in-process: prefix reuse, LRU eviction order, reset, and vLLM's hash function."""

from __future__ import annotations

import pytest

from e2e.sim.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from e2e.sim.hashing import cbor_dumps, hash_block_tokens, none_hash, sha256_cbor, to_external
from e2e.sim.kvcache import KVCache, LoraRef, NoSpace
from e2e.vllm_interop import load_kv_events


def make(num_blocks: int = 8) -> tuple[KVCache, list[KVEvent]]:
    events: list[KVEvent] = []
    return KVCache(num_blocks=num_blocks, block_size=4, emit=events.extend), events


def run(kv: KVCache, tokens: list[int], out: int = 0, lora: LoraRef | None = None) -> int:
    """Admit, prefill, finish one request; return its cached tokens."""
    hashes = kv.block_hashes(tokens, lora)
    alloc = kv.allocate(hashes, len(tokens), len(tokens) + out)
    kv.register(alloc, tokens, lora, None)
    kv.release(alloc)
    return alloc.hit_blocks * kv.block_size


def test_prefix_reuse_and_last_block_recompute() -> None:
    kv, events = make()
    toks = list(range(12))
    assert run(kv, toks) == 0
    (stored,) = events
    assert isinstance(stored, BlockStored) and len(stored.block_hashes) == 3 and stored.token_ids == toks
    # identical prompt: like vLLM, the last block is recomputed so one token remains to prefill
    assert run(kv, toks) == 8
    assert run(kv, [*toks, 99, 98]) == 12  # a longer prompt reuses all three blocks
    assert run(kv, [0, 1, 2, 3, 7, 7, 7, 7]) == 4  # diverges in block 2
    assert kv.usage() == 0


def test_lru_eviction_tail_first_and_referenced_blocks_are_kept() -> None:
    kv, events = make(num_blocks=6)
    a, b = list(range(100, 112)), list(range(200, 212))
    run(kv, a)
    run(kv, b)
    events.clear()
    a_hashes = [kv.ext(h) for h in kv.block_hashes(a)]
    b_hashes = [kv.ext(h) for h in kv.block_hashes(b)]
    # a third prompt needs 3 blocks: a's (oldest) are evicted, chain tail first
    hold = kv.allocate(kv.block_hashes(list(range(300, 312))), 12, 12)
    removed = [e.block_hashes[0] for e in events if isinstance(e, BlockRemoved)]
    assert removed == list(reversed(a_hashes))
    assert all(isinstance(e, BlockRemoved) and e.medium == "GPU" for e in events)
    # while held, nothing can push it out; b is still cached
    assert run(kv, b) == 8
    with pytest.raises(NoSpace):
        kv.allocate(kv.block_hashes(list(range(400, 428))), 28, 28)
    kv.release(hold)
    assert kv.used_blocks == 0 and not set(b_hashes) & set(removed)


def test_concurrent_identical_prompts_are_two_physical_copies_like_vllm() -> None:
    kv, events = make(num_blocks=4)
    toks = list(range(8))
    h = kv.block_hashes(toks)
    a1 = kv.allocate(h, 8, 8)
    a2 = kv.allocate(h, 8, 8)  # not computed yet: a miss, its own blocks
    assert a2.hit_blocks == 0
    kv.register(a1, toks, None, None)
    kv.register(a2, toks, None, None)
    stored = [e for e in events if isinstance(e, BlockStored)]
    assert len(stored) == 2 and stored[0].block_hashes == stored[1].block_hashes  # announced twice
    kv.release(a1)
    kv.release(a2)
    assert kv.used_blocks == 0 and kv.cached_blocks == 4
    events.clear()
    kv.allocate(kv.block_hashes(list(range(50, 66))), 16, 16)  # needs all 4 blocks: both copies go
    removed = [e.block_hashes[0] for e in events if isinstance(e, BlockRemoved)]
    assert sorted(removed) == sorted([kv.ext(x) for x in h] * 2)


def test_fully_cached_prompt_recomputes_and_reannounces_its_last_block() -> None:
    kv, events = make()
    toks = list(range(8))
    run(kv, toks)
    events.clear()
    assert run(kv, toks) == 4
    (ev,) = events
    assert isinstance(ev, BlockStored) and ev.token_ids == toks[4:]
    assert ev.parent_block_hash == kv.ext(kv.block_hashes(toks)[0])


def test_reset_only_when_idle() -> None:
    kv, events = make()
    hold = kv.allocate(kv.block_hashes(list(range(8))), 8, 8)
    assert not kv.reset()
    kv.release(hold)
    run(kv, list(range(8)))
    assert kv.reset() and isinstance(events[-1], AllBlocksCleared) and kv.cached_blocks == 0


def test_lora_changes_hashes_and_event_fields() -> None:
    kv, events = make()
    lora = LoraRef("sql", "/a/sql", 3)
    run(kv, list(range(8)), lora=lora)
    (ev,) = events
    assert isinstance(ev, BlockStored)
    assert ev.lora_id == 3 and ev.lora_name == "sql" and ev.extra_keys == [("sql",), ("sql",)]
    assert kv.block_hashes(list(range(8)), lora) != kv.block_hashes(list(range(8)))


def test_hashes_are_vllms_sha256_cbor() -> None:
    load_kv_events()  # installs the torch-free import path for vllm.utils
    import cbor2
    from vllm.utils import hashing as vh

    samples = [None, 0, 23, 24, 255, 256, 65536, 2**32, 2**63, -1, -500, b"\x00" * 32, "vllm-none-hash", "ü",
               (1, (2, 3), None), [("lora", "a", "/p")], tuple(range(300))]  # fmt: skip
    for s in samples:
        assert cbor_dumps(s) == cbor2.dumps(s, canonical=True)
        assert sha256_cbor(s) == vh.sha256_cbor(s)
    parent = none_hash()
    assert parent == vh.sha256_cbor("vllm-none-hash")
    h = hash_block_tokens(parent, list(range(16)), (("lora", "a", "/p"),))
    assert h == vh.sha256_cbor((parent, tuple(range(16)), (("lora", "a", "/p"),)))
    assert to_external(h) == int.from_bytes(h, "big") & (2**64 - 1)
    assert to_external(h, "bytes") == h


def test_decode_blocks_extend_the_chain() -> None:
    kv, events = make()
    prompt = list(range(6))  # one full block + 2 tokens
    alloc = kv.allocate(kv.block_hashes(prompt), 6, 6 + 6)
    kv.register(alloc, prompt, None, None)
    all_ids = [*prompt, 50, 51]  # decode computed the 7th and 8th tokens: block 2 is full
    kv.extend(alloc, all_ids, None, None)
    kv.release(alloc)
    first, second = events
    assert isinstance(first, BlockStored) and isinstance(second, BlockStored)
    assert second.parent_block_hash == first.block_hashes[-1] and second.token_ids == [4, 5, 50, 51]
    assert second.block_hashes == [kv.ext(kv.block_hashes(all_ids)[1])]
    # the next turn's prompt that contains the answer reuses both blocks
    assert run(kv, [*all_ids, 9, 9, 9]) == 8


def test_cache_salt_keys_the_first_block_only() -> None:
    kv, events = make()
    toks = list(range(8))
    salted = kv.block_hashes(toks, cache_salt="tenant-a")
    assert salted[0] != kv.block_hashes(toks)[0] and salted != kv.block_hashes(toks, cache_salt="tenant-b")
    alloc = kv.allocate(salted, 8, 8)
    kv.register(alloc, toks, None, "tenant-a")
    (ev,) = events
    assert isinstance(ev, BlockStored) and ev.extra_keys == [("tenant-a",), None]
