"""The routing suite's workloads: their shapes, the Mooncake conversation sampling and the reuse bound."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from e2e.workloads.agentic import agentic, no_reuse
from e2e.workloads.base import Request
from e2e.workloads.mooncake import mooncake_conversations, sample_conversations
from e2e.workloads.reuse import reuse_bound


def completion(t: float, prompt: str) -> Request:
    return Request(arrival=t, api="completions", body={"prompt": prompt})


def test_reuse_bound_counts_leading_blocks_seen_before() -> None:
    a = " alpha" * 64  # 64 tokens: 4 blocks of 16
    b = " beta" * 32
    reqs = [completion(0, a), completion(1, a + b), completion(2, b + a), completion(3, a)]
    r = reuse_bound(reqs, 16)
    assert r.prompt_tokens == 64 + 96 + 96 + 64
    # a+b reuses a's 4 blocks; b+a has no seen first block; the repeat of a reuses (64-1)//16 = 3 blocks
    assert r.reusable_tokens == 64 + 0 + 48
    # a warm-up: the first request fills the cache but is not counted
    w = reuse_bound(reqs, 16, count_after=0.5)
    assert (w.prompt_tokens, w.reusable_tokens) == (96 + 96 + 64, 64 + 48)


def test_agentic_grows_contexts_and_bursts_sub_agents() -> None:
    w = agentic(num_agents=6, steps=5, fanout_prob=1.0, fanout=(3, 3), seed=7)
    by_session: dict[str, list[Request]] = {}
    for r in w.requests:
        by_session.setdefault(r.session, []).append(r)
    main = by_session["a0"]
    assert [r.turn for r in main] == list(range(5))
    prompts = [str(r.body["prompt"]) for r in main]
    assert all(prompts[i + 1].startswith(prompts[i]) for i in range(4))  # the context only grows
    subs = [s for s in by_session if s.startswith("a0.0.")]
    assert len(subs) == 3  # a fan-out of 3 after step 0
    firsts = [by_session[s][0] for s in subs]
    assert max(r.arrival for r in firsts) - min(r.arrival for r in firsts) <= 0.02  # a burst
    assert all(str(r.body["prompt"]).startswith(prompts[0]) for r in firsts)  # sharing the agent's context
    assert [r.arrival for r in w.requests] == sorted(r.arrival for r in w.requests)


def test_no_reuse_prompts_share_nothing() -> None:
    w = no_reuse(num_requests=20, seed=1)
    assert reuse_bound(w.requests, 16).reusable_tokens == 0


def test_mooncake_sampling_keeps_whole_conversations(tmp_path: Path) -> None:
    rows = [
        {"timestamp": 0, "input_length": 1024, "output_length": 5, "hash_ids": [0, 3, 4]},
        {"timestamp": 1000, "input_length": 1024, "output_length": 5, "hash_ids": [0, 5, 6]},
        {"timestamp": 2000, "input_length": 1536, "output_length": 5, "hash_ids": [0, 3, 4, 7]},
        {"timestamp": 4000, "input_length": 1536, "output_length": 500, "hash_ids": [0, 6, 8, 9]},
    ]
    assert [r["hash_ids"][1] for r in sample_conversations(rows, 3)] == [3, 3, 6]  # type: ignore[index]
    assert [r["hash_ids"][1] for r in sample_conversations(rows, 3, phase=2)] == [5]  # type: ignore[index]
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    w = mooncake_conversations(path, every=3, duration=2.0, block_tokens=16, max_output=16)
    assert len(w.requests) == 3
    assert [r.arrival for r in w.requests] == [0.0, 1.0, 2.0]  # 4 s of trace compressed to 2 s
    assert w.requests[2].body["max_tokens"] == 16
    first, second = (str(r.body["prompt"]) for r in w.requests[:2])
    assert second.startswith(first)  # the conversation's second turn extends its first


def test_every_strategy_config_builds() -> None:
    """The suite's strategies are valid EPP configs (a bad parameter would only show after minutes of benchmark)."""
    from types import SimpleNamespace

    from e2e.strategies import LLMD, OURS, available_strategies, config_text
    from epp.config import parse_config
    from epp.datalayer.datastore import Datastore
    from epp.wiring import plugin_context
    from epp.wiring.builder import build_pipeline

    sims = [
        SimpleNamespace(host="127.0.0.1", http_port=8000 + i, event_port=5557 + i, replay_port=None) for i in range(2)
    ]
    names = available_strategies()
    assert {"random", "load", "approximate", "precise", LLMD, OURS} <= set(names)
    for name in names:
        text = config_text(name, sims, block_size=64, prefill_tps=1234.0)  # type: ignore[arg-type]
        p = build_pipeline(parse_config(text), plugin_context(Datastore()))
        assert p.scheduler.profiles["default"] is not None
        if name == OURS:
            assert "prefillTokensPerSecond: 1234.0" in text
            assert "prefill-cost-scorer" in p.plugins and "precise-prefix-cache-producer" in p.plugins
    overrides = {"uncachedWeight": 3, "precise-prefix-cache-producer.speculativeHold": "0s"}
    ours = config_text(OURS, sims, ours_overrides=overrides)  # type: ignore[arg-type]
    plugins = {p["type"]: p.get("parameters", {}) for p in yaml.safe_load(ours)["plugins"]}
    assert plugins["prefill-cost-scorer"]["uncachedWeight"] == 3
    assert plugins["precise-prefix-cache-producer"]["speculativeHold"] == "0s"


def test_suite_tables_medians_and_time_scale() -> None:
    """The routing suite's pieces that need no processes: repeated runs become medians, one markdown table per cell,
    and another simulator time scale replays the arrivals in proportion."""
    from e2e.bench.routing.suite import OURS, WORKLOADS, Cell, SimModel, goals, median_summary, table

    def run(label: str, p90: float, ok: int = 10) -> dict[str, object]:
        return {"label": label, "ok": ok, "n": 10, "ttft_p50": p90 / 2, "ttft_p90": p90, "ttft_p99": p90 * 2,
                "ttft_mean": p90, "e2e_p50": p90, "throughput_rps": 1.0, "output_tok_s": 8.0, "kv_hit_rate": 0.5,
                "load_cv": 0.1, "captured": 0.5, "bound": 1.0, "wall_s": 20.0}  # fmt: skip

    med = median_summary([run("a", 1.0), run("a", 3.0, ok=9), run("a", 2.0)])
    assert med["ttft_p90"] == 2.0 and (med["ok"], med["n"], med["runs"]) == (29, 30, 3)
    cell = Cell("multi-turn", 4, 16, 10, 5.0, 1.0, {}, summaries=[run("a", 1.0), run("b", 4.0)])
    lines = table(cell).splitlines()
    assert lines[0].startswith("| strategy |") and len(lines) == 4
    assert "| 50.0% | 100.0% / - |" in lines[2]  # a summary without a capacity bound (an older results.json)
    assert lines[2].endswith("| 0.25x |") and lines[3].endswith("| 4.00x |")  # p90 vs the best other strategy
    # goals: ours against the best other strategy (not our variants), the medians and each repeat paired
    rep = [[run(OURS, 1.0), run(f"{OURS}/v", 0.5), run(f"{OURS}@old", 0.5), run("llm-d-v0.10", 2.0)],
           [run(OURS, 3.0), run(f"{OURS}/v", 0.5), run(f"{OURS}/v@old", 0.5), run("llm-d-v0.10", 2.0)]]  # fmt: skip
    mine = [run(OURS, 2.0), run(f"{OURS}@old", 0.5), run("llm-d-v0.10", 2.5)]
    cell = Cell("multi-turn", 4, 16, 10, 5.0, 1.0, {}, summaries=mine, repeats=rep)
    assert "| multi-turn 4p/16 | 0.80 (per repeat 0.50, 1.50) | 0.80 |" in goals([cell])
    # the bound's lost tokens by why, and the capture where no holder was slower (affinity_trace.lost_reuse)
    lost = {"lost_slower": 0.04, "lost_miss": 0.01, "lost_engine": 0.0, "captured_not_slower": 0.99}
    cell = Cell("mooncake", 4, 16, 10, 5.0, 1.0, {}, summaries=[{**run(OURS, 1.0), **lost}, run("load", 2.0)])
    assert "| 50% | 4.0% / 1.0% / 0.0% | 0.10 |" in table(cell)
    # captured is measured against the capacity bound, and the table shows both bounds
    from e2e.bench.loadgen import RunSummary
    from e2e.bench.routing.suite import summary_dict

    measured = RunSummary(OURS, 10, 10, 5.0, 0.1, 0.2, 0.3, 0.1, 0.2, 2.0, 16.0, kv_hit_rate=0.4, load_cv=0.1)
    d = summary_dict(measured, bound=0.8, cap_bound=0.5)
    assert (d["captured"], d["captured_inf"]) == (0.8, 0.5)
    capped = Cell("mooncake", 4, 16, 10, 5.0, 0.8, {}, summaries=[d], cap_bound=0.5)
    assert "| 40.0% | 80.0% / 50.0% | 80% |" in table(capped)

    assert "| 50% (99%) |" in goals([cell])
    spec = WORKLOADS["no-reuse"]
    w, warmup = SimModel(time_scale=1.5).timed(spec.make(4, 0.3, 0), spec.warmup)
    ref = spec.make(4, 0.3, 0)
    assert warmup == spec.warmup / 2
    assert [r.arrival for r in w.requests] == [r.arrival / 2 for r in ref.requests]
    # another draw (--draws) is the same shape from another seed: as many requests, other arrivals and prompts
    for name in ("shared-prefix-demo", "multi-turn", "no-reuse"):
        a, b = WORKLOADS[name].make(4, 0.3, 0), WORKLOADS[name].make(4, 0.3, 1)
        assert len(a.requests) == len(b.requests) or name == "multi-turn"
        assert [r.arrival for r in a.requests] != [r.arrival for r in b.requests]
        assert [r.arrival for r in a.requests] == [r.arrival for r in WORKLOADS[name].make(4, 0.3, 0).requests]


def test_a_short_run_counts_its_second_half_and_a_full_one_keeps_the_warm_up() -> None:
    from e2e.bench.routing.suite import WORKLOADS, counted_after

    for name, spec in WORKLOADS.items():
        for pods in (4, 8):
            short, warmup = counted_after(spec.make(pods, 0.3, 0), spec.warmup)  # --quick's scale
            counted = [r for r in short.requests if r.arrival >= warmup]
            assert len(counted) >= len(short.requests) // 3, (name, pods, warmup, len(short.requests))
            _, warmup = counted_after(spec.make(pods, 1.0, 0), spec.warmup)
            assert warmup == spec.warmup, name


def test_suite_sources_name_checkouts_with_an_epp_package(tmp_path: Path) -> None:
    """`--sources name@checkout` (an A/B of code in one run) is refused unless the checkout holds an epp package."""
    from e2e.bench.routing.suite import SOURCES, main

    repo = Path(__file__).resolve().parents[1]  # holds an epp package
    assert main(["--sources", f"old@{tmp_path}", "--strategies", "pyepp-default@old"]) == 2
    assert main(["--sources", f"@{repo}"]) == 2
    assert main(["--sources", f"old@{repo}", "--strategies", "pyepp-default@new"]) == 2  # a name not given
    assert SOURCES["old"] == repo


def test_pick_parity_flags_and_table(tmp_path: Path) -> None:
    """--pick-parity wants two of the strategies run and --pick-logs; the table compares their pick logs per cell."""
    from e2e.bench.routing.suite import Cell, main, pick_parity
    from e2e.harness.picklog import Pick, write

    assert main(["--strategies", "load,random", "--pick-parity", "load:precise", "--pick-logs", str(tmp_path)]) == 2
    assert main(["--strategies", "load,random", "--pick-parity", "load:random"]) == 2
    a, b = "10.0.0.1:8000", "10.0.0.2:8000"
    write(tmp_path / "multi-turn_4_16_load.jsonl", [Pick(0, "", a, {a: 1.0, b: 0.5}), Pick(1, "", a, {a: 1.0})])
    write(tmp_path / "multi-turn_4_16_random.jsonl", [Pick(0, "", b, {a: 0.5, b: 1.0}), Pick(1, "", a, {a: 1.0})])
    runs = [{"label": "load", "ttft_p90": 2.0}, {"label": "random", "ttft_p90": 3.0}]
    cell = Cell("multi-turn", 4, 16, 2, 1.0, 0.5, {}, repeats=[runs])
    text = pick_parity(tmp_path, [("load", "random")], [cell])
    # renamed: both first picks go to an idle pod (the same pick); then load stays on its pod, random takes its idle one
    assert "| multi-turn 4:16 | load | random | 2 | 50.0% / 50.0% | 1 | 0 | scores 1 | 1.50 |" in text
