"""Checks on a pod's KV events against the pool's and the engine's facts, before they change shared state.

A publisher (or, in central-bind mode, anyone reaching the socket) decides what an event says. What it may not do:
- fix a model's block size with one event: a store's block size must be one an engine has (at most
  MAX_BLOCK_SIZE, its tokens filling exactly its blocks), the same for every store of a pod (and HMA group), and the
  pod's scraped `cache_config_info` block size when the pod has one. A size learned from events is provisional until
  a pod's scraped size confirms it; a confirmed size that differs replaces it and the pods keyed at the old size are
  cleared (their replay rebuilds them);
- claim more blocks than its tokens fill (`len(block_hashes)` > tokens / block size, rounded up);
- hold more than `maxBlocksPerPod` blocks in the index, or store faster than the per-pod rate budget;
- open per-pod state without bound: DP ranks and topic models per pod are bounded.
Each refusal is counted (`kv_cache_events_skipped_total{reason}`) and logged at most once per kind every 5 s.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from epp.framework.types import Endpoint

# vLLM's block sizes are 1-256 (hybrid models pad theirs up to a few thousand); SGLang's page size is 1-128.
MAX_BLOCK_SIZE = 16_384
MAX_RANKS_PER_POD = 64
MAX_MODELS_PER_POD = 32
MAX_GROUPS_PER_POD = 64


@dataclass(slots=True)
class Budgets:
    """Per-pod bounds (kvEventsConfig: maxBlocksPerPod, maxBlocksPerSecond, maxBlocksBurst)."""

    max_blocks_per_pod: int = 1 << 21  # far above a pod's GPU + CPU tiers (an 80 GB GPU holds ~40k 16-token blocks)
    blocks_per_second: float = 65_536.0  # a busy pod stores a few thousand blocks a second
    burst_blocks: int = 1 << 19  # 8 s at the rate: a replay after a reconnect, a long prompt's prefill


@dataclass(slots=True)
class _PodState:
    blocks: int = 0  # blocks in the index from this pod's stores (stored - removed; cleared to 0)
    tokens: float = 0.0  # rate bucket
    refilled: float = field(default_factory=time.monotonic)
    sizes: dict[tuple[int | None, int], int] = field(default_factory=dict)  # (HMA group, tier) -> block size


class EventGuard:
    """The per-pod facts and budgets the applier checks events against."""

    def __init__(self, budgets: Budgets | None = None) -> None:
        self.budgets = budgets or Budgets()
        self.endpoints: dict[str, Endpoint] = {}  # pod -> its endpoint (set by the subscriptions): scraped facts
        self._pods: dict[str, _PodState] = {}

    def scraped_block_size(self, pod: str) -> int:
        ep = self.endpoints.get(pod)
        return ep.metrics.cache_block_size if ep is not None else 0

    def _pod(self, pod: str) -> _PodState:
        st = self._pods.get(pod)
        if st is None:
            st = self._pods[pod] = _PodState(tokens=float(self.budgets.burst_blocks))
        return st

    def check_store(
        self, pod: str, group: int | None, tier: int, block_size: int, n_hashes: int, n_tokens: int
    ) -> str | None:
        """None if the store may be applied, else the reason it is refused. Block sizes are per (group, tier): an
        offloading connector may store CPU blocks of another size than the GPU's."""
        if block_size > MAX_BLOCK_SIZE:
            return "block_size"
        if n_tokens and n_hashes > -(-n_tokens // block_size):
            return "too_many_hashes"
        st = self._pod(pod)
        scraped = self.scraped_block_size(pod)
        if scraped > 0 and group is None and tier == 0 and block_size != scraped:
            return "block_size"
        known = st.sizes.get((group, tier))
        if known is None:
            if n_tokens:
                if len(st.sizes) >= MAX_GROUPS_PER_POD:
                    return "block_size"
                st.sizes[(group, tier)] = block_size
        elif known != block_size:
            return "block_size"
        if st.blocks + n_hashes > self.budgets.max_blocks_per_pod:
            return "pod_budget"
        now = time.monotonic()
        b = self.budgets
        st.tokens = min(float(b.burst_blocks), st.tokens + (now - st.refilled) * b.blocks_per_second)
        st.refilled = now
        if n_hashes > st.tokens:
            return "rate"
        st.tokens -= n_hashes
        return None

    def confirmed(self, pod: str, block_size: int) -> bool:
        """Whether `block_size` is the pod's scraped engine block size (a fact, not an event's word)."""
        return self.scraped_block_size(pod) == block_size

    def stored(self, pod: str, n: int) -> None:
        self._pod(pod).blocks += n

    def removed(self, pod: str, n: int) -> None:
        st = self._pods.get(pod)
        if st is not None:
            st.blocks = max(0, st.blocks - n)

    def cleared(self, pod: str) -> None:
        st = self._pods.get(pod)
        if st is not None:
            st.blocks = 0
            st.sizes.clear()

    def forget(self, pod: str) -> None:
        self._pods.pop(pod, None)
        self.endpoints.pop(pod, None)

    def blocks(self, pod: str) -> int:
        st = self._pods.get(pod)
        return st.blocks if st is not None else 0
