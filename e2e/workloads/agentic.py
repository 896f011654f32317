"""Agentic sessions: one shared tool/system prompt, contexts that grow with every tool output, and fan-outs where
an agent starts parallel sub-agents at once (a burst of requests sharing the agent's whole context).

Open loop: each step is scheduled at a fixed time (the previous step plus a think/tool time), not after the
previous response; the simulator's answers are not fed back, a stand-in answer of `output_len` tokens is.
"""

from __future__ import annotations

import random

from e2e.workloads.base import Request, Workload
from e2e.workloads.text import TextFactory


def agentic(
    *,
    num_agents: int = 12,
    steps: int = 6,
    system_prompt_len: int = 1500,
    task_len: int = 150,
    tool_output_len: tuple[int, int] = (80, 400),
    output_len: int = 16,
    agent_rate: float = 1.0,
    step_gap: float = 1.0,
    fanout_prob: float = 0.3,
    fanout: tuple[int, int] = (3, 4),
    subagent_steps: int = 2,
    model: str = "Qwen/Qwen2.5-0.5B-Instruct",
    seed: int = 0,
) -> Workload:
    texts = TextFactory(seed)
    rng = random.Random(seed)
    system = texts.text("agent-system", system_prompt_len)
    reqs: list[Request] = []

    def send(t: float, prompt: str, session: str, turn: int) -> None:
        body = {
            "model": model,
            "prompt": prompt,
            "max_tokens": output_len,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
        }
        reqs.append(Request(arrival=t, api="completions", body=body, group=session, session=session, turn=turn))

    def run(t: float, context: str, session: str, n_steps: int, depth: int) -> None:
        for k in range(n_steps):
            send(t, context, session, k)
            context += texts.text(("answer", session, k), output_len)
            if depth == 0 and k + 1 < n_steps and rng.random() < fanout_prob:
                for j in range(rng.randint(*fanout)):  # sub-agents start together: a burst sharing `context`
                    sub = context + texts.text(("subtask", session, k, j), 40)
                    run(t + rng.uniform(0.0, 0.02), sub, f"{session}.{k}.{j}", subagent_steps, depth + 1)
            context += texts.text(("tool", session, k), rng.randint(*tool_output_len))
            t += rng.expovariate(1.0 / step_gap)

    t0 = 0.0
    for a in range(num_agents):
        run(t0, system + texts.text(("task", a), task_len), f"a{a}", steps, 0)
        t0 += rng.expovariate(agent_rate)
    reqs.sort(key=lambda r: r.arrival)
    params = {
        "num_agents": num_agents, "steps": steps, "system_prompt_len": system_prompt_len, "task_len": task_len,
        "tool_output_len": list(tool_output_len), "output_len": output_len, "agent_rate": agent_rate,
        "step_gap": step_gap, "fanout_prob": fanout_prob, "fanout": list(fanout), "subagent_steps": subagent_steps,
        "seed": seed,
    }  # fmt: skip
    return Workload("agentic", reqs, params)


def no_reuse(
    *,
    num_requests: int = 300,
    prompt_len: tuple[int, int] = (300, 900),
    output_len: int = 16,
    rate: float = 10.0,
    model: str = "Qwen/Qwen2.5-0.5B-Instruct",
    seed: int = 0,
) -> Workload:
    """Every prompt unique from its first token: nothing to reuse, routing can only balance load."""
    texts = TextFactory(seed)
    rng = random.Random(seed)
    reqs: list[Request] = []
    t = 0.0
    for i in range(num_requests):
        body = {
            "model": model,
            "prompt": texts.text(("unique", i), rng.randint(*prompt_len)),
            "max_tokens": output_len,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
        }
        reqs.append(Request(arrival=t, api="completions", body=body, group=f"u{i}"))
        t += rng.expovariate(rate)
    params = {"num_requests": num_requests, "prompt_len": list(prompt_len), "output_len": output_len, "rate": rate}
    return Workload("no_reuse", reqs, params)
