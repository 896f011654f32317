"""Wiring: turns a config into running parts — registers the built-in plugin types, builds the plugin pipeline
and the shared services, and assembles the runtime (datastore, director, data layer) the server runs."""

from epp.wiring.builder import build_pipeline
from epp.wiring.builtins import BUILTIN_PLUGINS, known_types, register_builtins
from epp.wiring.runtime import Runtime, build_runtime, plugin_context, static_endpoints

__all__ = [
    "BUILTIN_PLUGINS",
    "Runtime",
    "build_pipeline",
    "build_runtime",
    "known_types",
    "plugin_context",
    "register_builtins",
    "static_endpoints",
]
