"""Built-in plugins. Importing this package registers every built-in type with the framework registry."""

from plugins import precise_prefix_cache  # noqa: F401  (registers the KV-cache plugins)
