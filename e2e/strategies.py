"""The routing strategies the demo and benchmarks compare, as EPP configs over simulator endpoints."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from e2e.harness.external import ExternalEpp
from e2e.harness.simconfig import Pod, sim_endpoints_yaml
from e2e.sim.launch import SimProcess

CONFIG_DIR = Path(__file__).resolve().parents[1] / "config"
# pyepp's shipped default (config/pyepp-default.yaml), run as shipped except for the prefill throughput, which the
# file says to set to the engine's (the benchmarks pass the simulator's).
OURS = "pyepp-default"
LLMD = "llm-d-v0.10"

PROFILES: dict[str, str] = {
    # llm-d's precise prefix-cache routing (KV events), with the blog's weights: prefix 3, kv-cache 2, queue 2.
    "precise": """
plugins:
- type: precise-prefix-cache-scorer
  parameters:
    tokenProcessorConfig: {{blockSize: {block_size}}}
    kvEventsConfig: {{topicFilter: "kv@"}}
- type: kv-cache-utilization-scorer
- type: queue-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - {{pluginRef: precise-prefix-cache-scorer, weight: 3}}
  - {{pluginRef: kv-cache-utilization-scorer, weight: 2}}
  - {{pluginRef: queue-scorer, weight: 2}}
  - {{pluginRef: max-score-picker}}
""",
    # GIE's default EndpointPickerConfig: approximate prefix (router-side history) 3, kv-cache 2, queue 2.
    "approximate": """
plugins:
- type: prefix-cache-scorer
- type: kv-cache-utilization-scorer
- type: queue-scorer
schedulingProfiles:
- name: default
  plugins:
  - {{pluginRef: prefix-cache-scorer, weight: 3}}
  - {{pluginRef: kv-cache-utilization-scorer, weight: 2}}
  - {{pluginRef: queue-scorer, weight: 2}}
""",
    # Cache-blind load balancing, as in the llm-d benchmark's "load" scheduler.
    "load": """
plugins:
- type: kv-cache-utilization-scorer
- type: queue-scorer
schedulingProfiles:
- name: default
  plugins:
  - {{pluginRef: kv-cache-utilization-scorer, weight: 1}}
  - {{pluginRef: queue-scorer, weight: 1}}
""",
    # llm-d-router v0.10's default, "sticky until saturated" (config/llm-d-sticky-precise.yaml): keep the request on
    # the pods caching >= 80% of its prompt unless that costs > 18 s of TTFT, then the fewest tokens in flight;
    # the precise producer says who caches what. peakPrefillThroughput is calibrated to the engines, as llm-d's
    # calibration recipe says to.
    LLMD: """
plugins:
- type: precise-prefix-cache-producer
  parameters: {{kvEventsConfig: {{topicFilter: "kv@"}}}}
- type: inflight-load-producer
  parameters: {{prefixMatchInfoProducerName: precise-prefix-cache-producer}}
- type: prefix-cache-affinity-filter
  parameters: {{prefixMatchInfoProducerName: precise-prefix-cache-producer, peakPrefillThroughput: {prefill_tps}}}
- type: token-load-scorer
schedulingProfiles:
- name: default
  plugins:
  - {{pluginRef: prefix-cache-affinity-filter}}
  - {{pluginRef: token-load-scorer}}
""",
    "round-robin": """
plugins: [{{type: round-robin-picker}}]
schedulingProfiles: [{{name: default, plugins: [{{pluginRef: round-robin-picker}}]}}]
""",
    "random": """
plugins: [{{type: random-picker}}]
schedulingProfiles: [{{name: default, plugins: [{{pluginRef: random-picker}}]}}]
""",
}


# Other EPPs run from their command lines (--external name=spec.yaml; e2e.harness.external), by strategy name.
EXTERNAL: dict[str, ExternalEpp] = {}

# The order strategies are listed in (tables, plots); files-based ones are appended by `available_strategies`.
ORDER = ["random", "round-robin", "load", "approximate", "precise", LLMD, OURS]


def available_strategies() -> list[str]:
    """Every strategy whose plugin types this EPP has, in table order."""
    return [s for s in ORDER if s in PROFILES or s == OURS]


def _ours(block_size: int, prefill_tps: float, overrides: dict[str, Any] | None = None) -> str:
    doc: dict[str, Any] = yaml.safe_load((CONFIG_DIR / "pyepp-default.yaml").read_text())
    # an override named "<plugin type>.<parameter>" goes to that plugin, a bare one to prefill-cost-scorer
    scoped: dict[str, dict[str, Any]] = {}
    for k, v in (overrides or {}).items():
        plugin, _, param = k.rpartition(".")
        scoped.setdefault(plugin or "prefill-cost-scorer", {})[param] = v
    for p in doc["plugins"]:
        if p["type"] == "prefill-cost-scorer":
            p.setdefault("parameters", {})["prefillTokensPerSecond"] = prefill_tps
        if p["type"] in scoped:
            p.setdefault("parameters", {}).update(scoped[p["type"]])
    return yaml.safe_dump(doc, sort_keys=False)


def endpoints_yaml(sims: Sequence[SimProcess] | Sequence[Pod]) -> str:
    return sim_endpoints_yaml(sims, by_port=True)


def config_text(
    strategy: str,
    sims: Sequence[SimProcess],
    *,
    block_size: int = 16,
    extra: str = "",
    prefill_tps: float = 15928.0,
    ours_overrides: dict[str, Any] | None = None,
) -> str:
    """The EPP config of `strategy` over `sims`; `prefill_tps` is the engines' prefill throughput (tokens/s) for
    the strategies that take it."""
    return chain_config(strategy, block_size=block_size, prefill_tps=prefill_tps, ours_overrides=ours_overrides) + (
        endpoints_yaml(sims) + extra
    )


def chain_config(
    strategy: str, *, block_size: int = 16, prefill_tps: float = 15928.0, ours_overrides: dict[str, Any] | None = None
) -> str:
    """The plugins and profiles of `strategy` (a config without its endpoints)."""
    if strategy == OURS:
        return _ours(block_size, prefill_tps, ours_overrides)
    if strategy not in PROFILES:
        raise ValueError(f"unknown strategy {strategy!r}; choose from {', '.join(available_strategies())}")
    return PROFILES[strategy].format(block_size=block_size, prefill_tps=prefill_tps).lstrip()
