"""The unlimited-cache reuse bound of a workload: the share of prompt tokens a single cache that never evicts
would serve from blocks an earlier request (in arrival order) already computed.

Prompts are tokenized as the simulator does (completions as is, chat through the Qwen2.5 template) and cut
into full blocks of `block_size` tokens chained by hash, the way vLLM keys prefix blocks; like vLLM, the last
prompt token is always computed, so a request hits at most (n - 1) // block_size blocks. No routing and no
finite cache can capture more than this.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from e2e.sim.tokenizer import SimTokenizer, shared_tokenizer
from e2e.workloads.base import Request


@dataclass(slots=True)
class ReuseBound:
    prompt_tokens: int
    reusable_tokens: int

    @property
    def share(self) -> float:
        return self.reusable_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def prompt_ids(req: Request, tok: SimTokenizer) -> list[int]:
    if req.api == "chat":
        return tok.chat_ids(req.body["messages"], add_generation_prompt=True)
    return tok.encode(str(req.body["prompt"]))


def reuse_bound(
    requests: Sequence[Request],
    block_size: int,
    tok: SimTokenizer | None = None,
    ids: list[list[int]] | None = None,
    count_after: float = 0.0,
) -> ReuseBound:
    """`ids` (the requests' token ids, in the same order) skips tokenizing again. Requests arriving before
    `count_after` (a warm-up) fill the cache but are not counted."""
    tok = tok or shared_tokenizer()
    order = sorted(range(len(requests)), key=lambda i: requests[i].arrival)
    seen: set[int] = set()
    total = reused = 0
    for i in order:
        toks = ids[i] if ids is not None else prompt_ids(requests[i], tok)
        n = len(toks)
        counted = requests[i].arrival >= count_after
        total += n if counted else 0
        chain = block_chain(toks, block_size)
        for h in chain[: reusable_blocks(n, block_size)]:
            if h not in seen:
                break
            reused += block_size if counted else 0
        seen.update(chain)
    return ReuseBound(total, reused)


def block_chain(toks: Sequence[int], block_size: int) -> list[int]:
    """The prompt's full blocks, each keyed by a hash chained over every block before it (a key implies its
    prefix)."""
    out, parent = [], 0
    for b in range(len(toks) // block_size):
        parent = hash((parent, tuple(toks[b * block_size : (b + 1) * block_size])))
        out.append(parent)
    return out


def reusable_blocks(n: int, block_size: int) -> int:
    """At most this many blocks of an `n`-token prompt can hit: the last prompt token is always computed."""
    return max(0, (n - 1) // block_size)
