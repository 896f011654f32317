from functools import lru_cache
from pathlib import Path
from typing import Any

from e2e.bench.loadgen import Result, percentile, summarize
from e2e.workloads.mooncake import mooncake_replay, parse_trace
from e2e.workloads.multiturn import multi_turn_chat
from e2e.workloads.shared_prefix import shared_prefix
from epp.tokenization.qwen import load_qwen25_tokenizer

SAMPLE = Path(__file__).resolve().parents[2] / "e2e" / "workloads" / "data" / "mooncake_sample.jsonl"


@lru_cache(maxsize=1)
def _tokenizer() -> Any:
    return load_qwen25_tokenizer()


def _ntok(text: str) -> int:
    return len(_tokenizer().encode(text, add_special_tokens=False))


def test_shared_prefix_lengths_and_sharing() -> None:
    w = shared_prefix(num_groups=3, num_prompts_per_group=4, system_prompt_len=64, question_len=16, num_requests=30)
    assert len(w.requests) == 30
    by_group: dict[str, set[str]] = {}
    for r in w.requests:
        prompt = r.body["prompt"]
        assert _ntok(prompt) == 80
        by_group.setdefault(r.group, set()).add(prompt[: len(prompt) // 2])
    # every request of a group starts with that group's system prompt; groups differ
    prefixes = {g: {p[:200] for p in ps} for g, ps in by_group.items()}
    assert all(len(p) == 1 for p in prefixes.values())
    assert len({next(iter(p)) for p in prefixes.values()}) == len(prefixes)
    arrivals = [r.arrival for r in w.requests]
    assert arrivals == sorted(arrivals) and w.duration > 0


def test_multi_turn_prompts_extend_previous_turn() -> None:
    w = multi_turn_chat(num_sessions=3, turns=3, system_prompt_len=32, user_len=8, output_len=8)
    assert len(w.requests) == 9
    last: dict[str, list[dict[str, str]]] = {}
    for r in w.requests:
        msgs = r.body["messages"]
        prev = last.get(r.session)
        if prev is not None:
            assert msgs[: len(prev)] == prev and len(msgs) == len(prev) + 2
        last[r.session] = msgs


def test_mooncake_replay_shares_prefixes_by_hash_id() -> None:
    rows = parse_trace(SAMPLE.read_text().splitlines())
    assert len(rows) == 60
    w = mooncake_replay(SAMPLE, block_tokens=16, time_scale=0.01)
    a, b = [r for r in w.requests if r.group == "46"][:2]
    # 12 shared blocks of 16 tokens
    pa, pb = a.body["prompt"], b.body["prompt"]
    common = 0
    while common < min(len(pa), len(pb)) and pa[common] == pb[common]:
        common += 1
    assert _ntok(pa[:common]) >= 12 * 16 - 1
    assert _ntok(pa) == 6264 * 16 // 512
    assert w.requests[9].arrival > 0


def test_summary_stats() -> None:
    assert percentile([1, 2, 3, 4], 0.5) == 2.5
    results = [
        Result("g", 200, 0.1, 0.2, prompt_tokens=100, cached_tokens=50, completion_tokens=10, served_by="a"),
        Result("g", 200, 0.3, 0.4, prompt_tokens=100, cached_tokens=0, completion_tokens=10, served_by="b"),
        Result("g", 503, None, 0.01),
    ]
    s = summarize("x", results, 2.0, pods=["a", "b", "c"])
    assert s.ok == 2 and s.kv_hit_rate == 0.25 and s.per_pod == {"a": 1, "b": 1, "c": 0}
    assert abs(s.load_cv - 0.7071) < 1e-3
