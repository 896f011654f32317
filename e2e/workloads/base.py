"""The unit a load generator sends: one OpenAI request with a scheduled arrival time."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Request:
    arrival: float  # seconds after the run starts
    api: str  # "completions" | "chat"
    body: dict[str, Any]
    group: str = ""  # the shared prefix (or session) this request belongs to
    headers: dict[str, str] = field(default_factory=dict)
    # For multi-turn sessions: the index of the previous turn whose answer this one extends.
    session: str = ""
    turn: int = 0


@dataclass(slots=True)
class Workload:
    name: str
    requests: list[Request]
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def duration(self) -> float:
        return max((r.arrival for r in self.requests), default=0.0)
