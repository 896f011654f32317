"""The routing strategies the demo and benchmarks compare, as EPP configs over simulator endpoints."""

from __future__ import annotations

from collections.abc import Sequence

from e2e.sim.launch import SimProcess
from epp.kvcache.subscriptions import EVENTS_PORT_LABEL, REPLAY_PORT_LABEL

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


def config_text(strategy: str, sims: Sequence[SimProcess], *, block_size: int = 16, extra: str = "") -> str:
    if strategy not in PROFILES:
        raise ValueError(f"unknown strategy {strategy!r}; choose from {', '.join(PROFILES)}")
    return PROFILES[strategy].format(block_size=block_size).lstrip() + endpoints_yaml(sims) + extra
