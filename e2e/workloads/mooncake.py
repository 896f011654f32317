"""Replay a Mooncake-format trace: JSONL `{timestamp (ms), input_length, output_length, hash_ids}`.

Identical hash ids are identical 512-token blocks in the original trace; each id becomes a seeded
block of text, so requests sharing leading ids share a real prefix. `block_tokens` and `time_scale`
shrink a trace to fit a small machine.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from e2e.workloads.base import Request, Workload
from e2e.workloads.text import TextFactory


def parse_trace(lines: Iterable[str]) -> list[dict[str, object]]:
    rows = []
    for n, line in enumerate(lines, 1):
        line = line.strip()
        if not line:
            continue
        row = json.loads(line)
        for key in ("timestamp", "input_length", "output_length", "hash_ids"):
            if key not in row:
                raise ValueError(f"trace line {n}: missing {key!r}")
        rows.append(row)
    return rows


def mooncake_replay(
    path: str | Path,
    *,
    block_tokens: int = 512,
    source_block_tokens: int = 512,
    time_scale: float = 1.0,
    max_requests: int | None = None,
    max_output: int | None = None,
    model: str = "Qwen/Qwen2.5-0.5B-Instruct",
    seed: int = 0,
) -> Workload:
    rows = parse_trace(Path(path).read_text().splitlines())
    if max_requests is not None:
        rows = rows[:max_requests]
    reqs = replay_rows(rows, block_tokens=block_tokens, source_block_tokens=source_block_tokens,
                       time_scale=time_scale, max_output=max_output, model=model, seed=seed)  # fmt: skip
    return Workload("mooncake", reqs, {"path": str(path), "block_tokens": block_tokens, "time_scale": time_scale})


def replay_rows(
    rows: list[dict[str, object]],
    *,
    block_tokens: int,
    source_block_tokens: int = 512,
    time_scale: float = 1.0,
    max_output: int | None = None,
    model: str = "Qwen/Qwen2.5-0.5B-Instruct",
    seed: int = 0,
) -> list[Request]:
    texts = TextFactory(seed)
    t0 = float(rows[0]["timestamp"]) if rows else 0.0  # type: ignore[arg-type]
    reqs = []
    for row in rows:
        ids: list[int] = list(row["hash_ids"])  # type: ignore[call-overload]
        in_len = int(row["input_length"])  # type: ignore[call-overload]
        scaled_len = max(1, in_len * block_tokens // source_block_tokens)
        words = [w for h in ids for w in texts.tokens(("block", h), block_tokens)]
        del words[scaled_len:]  # the last block of a trace row is usually partial
        out = int(row["output_length"])  # type: ignore[call-overload]
        if max_output is not None:
            out = min(out, max_output)
        body = {
            "model": model,
            "prompt": "".join(words),
            "max_tokens": max(1, out),
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
        }
        arrival = (float(row["timestamp"]) - t0) / 1000.0 * time_scale  # type: ignore[arg-type]
        reqs.append(Request(arrival=arrival, api="completions", body=body, group=str(ids[0]) if ids else ""))
    return reqs


def sample_conversations(rows: list[dict[str, object]], every: int, phase: int = 0) -> list[dict[str, object]]:
    """Whole conversations, not a time window: keep the rows whose second block id (the one after the shared
    system-prompt block 0, which tells conversations apart) is `phase` modulo `every` (another phase, another
    sample of the same size)."""
    out = []
    phase %= every
    for row in rows:
        ids: list[int] = list(row["hash_ids"])  # type: ignore[call-overload]
        if len(ids) > 1 and ids[1] % every == phase:
            out.append(row)
    return out


def mooncake_conversations(
    path: str | Path,
    *,
    every: int = 30,
    duration: float = 20.0,
    block_tokens: int = 16,
    max_output: int | None = 16,
    window_s: float | None = None,
    model: str = "Qwen/Qwen2.5-0.5B-Instruct",
    seed: int = 0,
    phase: int = 0,
) -> Workload:
    """The Mooncake FAST'25 conversation trace, sampled by conversation (`every`, `phase`), optionally cut to its first
    `window_s` seconds, with 512-token blocks shrunk to `block_tokens` and time compressed to `duration` s."""
    rows = parse_trace(Path(path).read_text().splitlines())
    if window_s is not None:
        rows = [r for r in rows if float(r["timestamp"]) <= window_s * 1000.0]  # type: ignore[arg-type]
    rows = sample_conversations(rows, every, phase)
    span = (float(rows[-1]["timestamp"]) - float(rows[0]["timestamp"])) / 1000.0 if rows else 0.0  # type: ignore[arg-type]
    scale = duration / span if span > 0 else 1.0
    reqs = replay_rows(rows, block_tokens=block_tokens, time_scale=scale, max_output=max_output, model=model,
                       seed=seed)  # fmt: skip
    params = {
        "path": str(path), "every": every, "phase": phase, "window_s": window_s, "rows": len(rows),
        "block_tokens": block_tokens, "trace_span_s": round(span, 1), "time_scale": scale, "max_output": max_output,
    }  # fmt: skip
    return Workload("mooncake_conversation", reqs, params)
