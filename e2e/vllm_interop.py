"""Import vLLM's real KV-event structs and ZMQ publisher (`vllm.distributed.kv_events`) without torch.

vLLM is installed with `pip install --no-deps` (see the Makefile). Its package `__init__` files pull in
torch, so the few packages on the import path are created bare (their own modules still load from
vLLM's files), and the two modules that only contribute type names (`KVEventsConfig`,
`ExternalBlockHash`) are given as those names. Everything we test against (the msgspec structs, the
EventBatch encoding, ZmqEventPublisher with its ROUTER replay socket) is vLLM's own code.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from pathlib import Path
from typing import Any

_BARE = ("vllm", "vllm.distributed", "vllm.config", "vllm.v1", "vllm.v1.core", "vllm.utils")


class _BarePackages(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, root: Path) -> None:
        self.root = root

    def _dir(self, name: str) -> Path:
        return self.root.joinpath(*name.split("."))

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name not in _BARE:
            return None
        spec = importlib.machinery.ModuleSpec(name, self, is_package=True)
        spec.submodule_search_locations = [str(self._dir(name))]
        return spec

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        module.__path__ = [str(self._dir(module.__name__))]


def load_kv_events() -> types.ModuleType:
    """Return vLLM's `vllm.distributed.kv_events` module."""
    if "vllm.distributed.kv_events" in sys.modules:
        return sys.modules["vllm.distributed.kv_events"]
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        raise ImportError("vllm is not installed (make setup installs it with --no-deps)")
    sys.meta_path.insert(0, _BarePackages(Path(spec.origin).parent.parent))
    stand_ins: dict[str, dict[str, object]] = {
        "vllm.config.kv_events": {"KVEventsConfig": object},
        "vllm.v1.core.kv_cache_utils": {"ExternalBlockHash": bytes | int},
    }
    for name, attrs in stand_ins.items():
        mod = types.ModuleType(name)
        mod.__dict__.update(attrs)
        sys.modules.setdefault(name, mod)
    import vllm.distributed.kv_events as kv_events

    return kv_events
