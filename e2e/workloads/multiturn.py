"""Multi-turn chat: each session's turn k resends the whole conversation so far plus a new user message."""

from __future__ import annotations

import random

from e2e.workloads.base import Request, Workload
from e2e.workloads.text import TextFactory


def multi_turn_chat(
    *,
    num_sessions: int = 8,
    turns: int = 4,
    system_prompt_len: int = 1000,
    user_len: int = 200,
    output_len: int = 50,
    rate: float = 4.0,
    model: str = "Qwen/Qwen2.5-0.5B-Instruct",
    seed: int = 0,
) -> Workload:
    """The assistant's earlier answers are stand-in text of `output_len` tokens (the simulator's answer is not
    fed back), so every turn's prompt extends the previous turn's prompt: the prefix a router should follow."""
    texts = TextFactory(seed)
    rng = random.Random(seed)
    system = texts.text("mt-system", system_prompt_len)
    history: list[list[dict[str, str]]] = [[{"role": "system", "content": system}] for _ in range(num_sessions)]
    pending = [(s, 0) for s in range(num_sessions)]
    reqs: list[Request] = []
    t = 0.0
    while pending:
        i = rng.randrange(len(pending))
        s, k = pending[i]
        history[s].append({"role": "user", "content": texts.text(("user", s, k), user_len)})
        body = {
            "model": model,
            "messages": [dict(m) for m in history[s]],
            "max_tokens": output_len,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
        }
        reqs.append(Request(arrival=t, api="chat", body=body, group=f"s{s}", session=f"s{s}", turn=k))
        history[s].append({"role": "assistant", "content": texts.text(("assistant", s, k), output_len)})
        if k + 1 < turns:
            pending[i] = (s, k + 1)
        else:
            pending.pop(i)
        t += rng.expovariate(rate)
    params = {"num_sessions": num_sessions, "turns": turns, "system_prompt_len": system_prompt_len, "rate": rate}
    return Workload("multi_turn_chat", reqs, params)
