"""Workload generators: llm-d's shared-prefix shape, multi-turn chat, and Mooncake trace replay."""

from e2e.workloads.base import Request, Workload
from e2e.workloads.text import TextFactory

__all__ = ["Request", "TextFactory", "Workload"]
