"""Helpers shared by the unit tests."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from epp.datalayer.datastore import Datastore
from epp.framework import Params, Plugin, PluginContext
from epp.wiring import plugin_context

P = TypeVar("P", bound=Plugin)


def build(
    cls: type[P], parameters: Mapping[str, Any] | None = None, *, name: str = "", ctx: PluginContext | None = None
) -> P:
    """A plugin from plain parameters, as the config builder would make it (a fresh context by default)."""
    context = ctx if ctx is not None else plugin_context(Datastore())
    plugin_name = name or cls.type_name
    return cls.from_config(plugin_name, Params(plugin_name, parameters), context)
