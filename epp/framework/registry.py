"""Plugin types by name. The framework imports no plugin: the wiring registers the built-ins explicitly
(`epp.wiring.register_builtins()`), and third-party packages add theirs through the `epp.plugins` entry-point
group (an entry point names a Plugin subclass or a factory; its name is the type)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

from epp.framework.params import Params

if TYPE_CHECKING:
    from epp.framework.context import PluginContext

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "epp.plugins"

# Builds a plugin instance from its name, its parameters and the context.
Factory = Callable[[str, Params, "PluginContext"], Any]


class PluginRegistry:
    def __init__(self) -> None:
        self._factories: dict[str, Factory] = {}
        self._entry_points_loaded = False

    def register(self, cls: type[Any], *, type_name: str | None = None) -> None:
        """Register a Plugin subclass under its `type_name` and `aliases` (or under `type_name` given here)."""
        name = type_name or getattr(cls, "type_name", "")
        if not name:
            raise ValueError(f"{cls.__name__} has no type_name")
        factory: Factory = cls.from_config
        for t in (name, *getattr(cls, "aliases", ())):
            existing = self._factories.get(t)
            if existing is not None and existing != factory:
                raise ValueError(f"plugin type {t!r} is already registered")
            self._factories[t] = factory

    def register_factory(self, type_name: str, factory: Factory) -> None:
        if type_name in self._factories:
            raise ValueError(f"plugin type {type_name!r} is already registered")
        self._factories[type_name] = factory

    def load_entry_points(self, group: str = ENTRY_POINT_GROUP) -> None:
        """Add third-party plugin types (once); a type that is already registered keeps the built-in."""
        if self._entry_points_loaded:
            return
        self._entry_points_loaded = True
        for ep in entry_points(group=group):
            if ep.name in self._factories:
                log.warning("plugin entry point %s ignored: the type is already registered", ep.name)
                continue
            try:
                obj = ep.load()
            except Exception:
                log.exception("failed to load plugin entry point %s", ep.name)
                continue
            factory = getattr(obj, "from_config", obj)
            if callable(factory):
                self._factories[ep.name] = factory
            else:
                log.error("plugin entry point %s is neither a plugin class nor a factory", ep.name)

    def factory(self, type_name: str) -> Factory | None:
        return self._factories.get(type_name)

    def known_types(self) -> list[str]:
        return sorted(self._factories)


# The process-wide registry the config builder reads.
REGISTRY = PluginRegistry()


def get_factory(type_name: str) -> Factory | None:
    return REGISTRY.factory(type_name)


def known_types() -> list[str]:
    """The types registered so far (the wiring's `known_types()` registers the built-ins first)."""
    return REGISTRY.known_types()
