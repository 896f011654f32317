"""llm-d / inference-perf `shared_prefix`: groups × prompts per group, each prompt = group system prompt + question."""

from __future__ import annotations

import random

from e2e.workloads.base import Request, Workload
from e2e.workloads.text import TextFactory


def shared_prefix(
    *,
    num_groups: int = 10,
    num_prompts_per_group: int = 10,
    system_prompt_len: int = 100,
    question_len: int = 50,
    output_len: int = 50,
    rate: float = 5.0,
    num_requests: int | None = None,
    model: str = "Qwen/Qwen2.5-0.5B-Instruct",
    poisson: bool = True,
    seed: int = 0,
    api: str = "completions",
) -> Workload:
    """Requests pick a (group, prompt) uniformly at random, like inference-perf; arrivals at `rate` req/s."""
    texts = TextFactory(seed)
    rng = random.Random(seed)
    systems = [texts.text(("system", g), system_prompt_len) for g in range(num_groups)]
    questions = [
        [texts.text(("question", g, p), question_len) for p in range(num_prompts_per_group)] for g in range(num_groups)
    ]
    total = num_requests if num_requests is not None else num_groups * num_prompts_per_group
    t = 0.0
    reqs: list[Request] = []
    for _ in range(total):
        g = rng.randrange(num_groups)
        p = rng.randrange(num_prompts_per_group)
        body: dict[str, object] = {"model": model, "max_tokens": output_len, "stream": True, "ignore_eos": True}
        body["stream_options"] = {"include_usage": True}
        if api == "chat":
            body["messages"] = [{"role": "system", "content": systems[g]}, {"role": "user", "content": questions[g][p]}]
        else:
            body["prompt"] = systems[g] + questions[g][p]
        reqs.append(Request(arrival=t, api=api, body=body, group=f"g{g}"))
        t += rng.expovariate(rate) if poisson else 1.0 / rate
    params = {
        "num_groups": num_groups,
        "num_prompts_per_group": num_prompts_per_group,
        "system_prompt_len": system_prompt_len,
        "question_len": question_len,
        "output_len": output_len,
        "rate": rate,
        "num_requests": total,
        "poisson": poisson,
        "seed": seed,
    }
    return Workload("shared_prefix", reqs, params)
