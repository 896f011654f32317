"""The `endpoints:` section of an EPP config over simulated model servers, with their KV-event ports as labels."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from e2e.sim.launch import SimProcess
from epp.kvcache.subscriptions import EVENTS_PORT_LABEL, REPLAY_PORT_LABEL


class Pod(Protocol):
    """A model server the benchmarks route to: a simulator process or another engine's (e2e.harness.engines)."""

    host: str
    http_port: int

    @property
    def event_port(self) -> int | None: ...
    @property
    def replay_port(self) -> int | None: ...


def pod_name(pod: Pod) -> str:
    """The name a benchmark gives a pod (its endpoint name and the `x-inference-pod` it answers with): by port on
    127.0.0.1, by address when every pod has its own loopback address (and the same ports)."""
    return f"sim-{pod.http_port}" if pod.host == "127.0.0.1" else "sim-" + pod.host.replace(".", "-")


def sim_endpoints_yaml(
    sims: Sequence[SimProcess] | Sequence[Pod], *, by_port: bool = False, labels: Mapping[str, str] | None = None
) -> str:
    """`endpoints:` listing `sims` as `sim<i>` (`pod_name` with `by_port`), each labelled with the ports its
    KV events (and replays) are published on, so the EPP dials them; `labels` are added to (or override) every
    endpoint's labels."""
    lines = ["endpoints:"]
    for i, s in enumerate(sims):
        tags: dict[str, str] = {}
        if s.event_port is not None:
            tags[EVENTS_PORT_LABEL] = str(s.event_port)
        if s.replay_port is not None:
            tags[REPLAY_PORT_LABEL] = str(s.replay_port)
        tags.update(labels or {})
        name = pod_name(s) if by_port else f"sim{i}"
        text = ", ".join(f"{k}: '{v}'" for k, v in tags.items())
        lines.append(f"- {{name: {name}, address: {s.host}, port: {s.http_port}, labels: {{{text}}}}}")
    return "\n".join(lines) + "\n"
