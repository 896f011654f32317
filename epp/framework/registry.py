"""Plugin registry keyed by `type`: built-ins from `plugins/`, third-party via `epp.plugins` entry points."""

from __future__ import annotations

import logging
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any, TypeVar

log = logging.getLogger(__name__)

# A factory builds a plugin from (name, parameters, context). `context` is a PluginContext.
Factory = Callable[[str, dict[str, Any], Any], Any]
T = TypeVar("T")

_FACTORIES: dict[str, Factory] = {}
_loaded_entry_points = False


def register(type_name: str, *aliases: str) -> Callable[[T], T]:
    """Class decorator: the class must offer `from_config(name, parameters, context)`."""

    def deco(cls: T) -> T:
        factory = getattr(cls, "from_config")  # noqa: B009 (T is unbounded)
        for t in (type_name, *aliases):
            _FACTORIES[t] = factory
        if not getattr(cls, "type_name", ""):
            setattr(cls, "type_name", type_name)  # noqa: B010
        return cls

    return deco


def register_factory(type_name: str, factory: Factory) -> None:
    _FACTORIES[type_name] = factory


def _load_entry_points() -> None:
    global _loaded_entry_points
    if _loaded_entry_points:
        return
    _loaded_entry_points = True
    import plugins  # noqa: F401  (built-ins register themselves on import)

    for ep in entry_points(group="epp.plugins"):
        try:
            obj = ep.load()
            if callable(obj) and ep.name not in _FACTORIES:
                register_factory(ep.name, getattr(obj, "from_config", obj))
        except Exception:
            log.exception("failed to load plugin entry point %s", ep.name)


def get_factory(type_name: str) -> Factory | None:
    _load_entry_points()
    return _FACTORIES.get(type_name)


def known_types() -> list[str]:
    _load_entry_points()
    return sorted(_FACTORIES)
