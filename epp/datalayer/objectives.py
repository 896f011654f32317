"""InferenceObjective priorities by name (from the config file, or watched from the cluster)."""

from __future__ import annotations


class ObjectiveStore:
    """`x-gateway-inference-objective: <name>` → priority. Unknown or absent names mean priority 0."""

    def __init__(self, initial: dict[str, int] | None = None) -> None:
        self._priorities: dict[str, int] = dict(initial or {})

    def set(self, name: str, priority: int) -> None:
        self._priorities[name] = priority

    def remove(self, name: str) -> None:
        self._priorities.pop(name, None)

    def replace_all(self, priorities: dict[str, int]) -> None:
        self._priorities = dict(priorities)

    def priority(self, name: str | None) -> int:
        if not name:
            return 0
        return self._priorities.get(name, 0)

    def names(self) -> list[str]:
        return sorted(self._priorities)
