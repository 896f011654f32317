"""The built-in plugin types, one module per type, grouped by extension point. They import only `epp.framework`.

Importing this package registers nothing: `epp.wiring.register_builtins()` does, from its explicit list.
"""
