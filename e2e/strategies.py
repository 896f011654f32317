"""The routing strategies the demo and benchmarks compare, as EPP configs over simulator endpoints."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from e2e.sim.launch import SimProcess
from epp.kvcache.subscriptions import EVENTS_PORT_LABEL, REPLAY_PORT_LABEL

CONFIG_DIR = Path(__file__).resolve().parents[1] / "config"
# pyepp's shipped default (config/pyepp-default.yaml), run as shipped except for the prefill throughput, which the
# file says to set to the engine's (the benchmarks pass the simulator's).
OURS = "pyepp-default"

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
    "round-robin": """
plugins: [{{type: round-robin-picker}}]
schedulingProfiles: [{{name: default, plugins: [{{pluginRef: round-robin-picker}}]}}]
""",
    "random": """
plugins: [{{type: random-picker}}]
schedulingProfiles: [{{name: default, plugins: [{{pluginRef: random-picker}}]}}]
""",
}


# The order strategies are listed in (tables, plots); files-based ones are appended by `available_strategies`.
ORDER = ["random", "round-robin", "load", "approximate", "precise", OURS]


def available_strategies() -> list[str]:
    """Every strategy whose plugin types this EPP has, in table order."""
    return [s for s in ORDER if s in PROFILES or s == OURS]


def _ours(block_size: int, prefill_tps: float) -> str:
    doc: dict[str, Any] = yaml.safe_load((CONFIG_DIR / "pyepp-default.yaml").read_text())
    for p in doc["plugins"]:
        if p["type"] == "prefill-cost-scorer":
            p.setdefault("parameters", {})["prefillTokensPerSecond"] = prefill_tps
    return yaml.safe_dump(doc, sort_keys=False)


def endpoints_yaml(sims: Sequence[SimProcess]) -> str:
    lines = ["endpoints:"]
    for s in sims:
        labels = []
        if s.event_port is not None:
            labels.append(f'{EVENTS_PORT_LABEL}: "{s.event_port}"')
        if s.replay_port is not None:
            labels.append(f'{REPLAY_PORT_LABEL}: "{s.replay_port}"')
        lines.append(
            f"- {{name: sim-{s.http_port}, address: {s.host}, port: {s.http_port}, labels: {{{', '.join(labels)}}}}}"
        )
    return "\n".join(lines) + "\n"


def config_text(
    strategy: str, sims: Sequence[SimProcess], *, block_size: int = 16, extra: str = "", prefill_tps: float = 15928.0
) -> str:
    """The EPP config of `strategy` over `sims`; `prefill_tps` is the engines' prefill throughput (tokens/s) for
    the strategies that take it."""
    if strategy == OURS:
        return _ours(block_size, prefill_tps) + endpoints_yaml(sims) + extra
    if strategy not in PROFILES:
        raise ValueError(f"unknown strategy {strategy!r}; choose from {', '.join(available_strategies())}")
    return PROFILES[strategy].format(block_size=block_size).lstrip() + endpoints_yaml(sims) + extra
