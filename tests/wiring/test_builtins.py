"""Explicit registration: the catalog is one list, registered by the wiring; the framework imports no plugin."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from epp.framework import Plugin, PluginRegistry
from epp.wiring import BUILTIN_PLUGINS, register_builtins


def fresh_process(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60).stdout


def test_known_types_in_a_fresh_process_lists_every_builtin() -> None:
    names = sorted({t for cls in BUILTIN_PLUGINS for t in (cls.type_name, *cls.aliases)})
    out = fresh_process("import json; from epp.wiring import known_types; print(json.dumps(known_types()))")
    assert set(names) <= set(json.loads(out))
    # the same set as after building a full config in this process (no type appears only as an import side effect)
    assert set(json.loads(out)) == set(register_builtins(PluginRegistry()).known_types())


def test_the_framework_imports_no_plugin() -> None:
    code = (
        "import sys, epp.framework, epp.framework.registry as r; "
        "print(sorted(m for m in sys.modules if m.startswith('epp.') and not m.startswith('epp.framework')), "
        "len(r.known_types()))"
    )
    assert fresh_process(code).split() == ["[]", "0"]


def test_every_builtin_declares_a_unique_type() -> None:
    seen: dict[str, str] = {}
    for cls in BUILTIN_PLUGINS:
        assert cls.type_name, cls
        for t in (cls.type_name, *cls.aliases):
            assert t not in seen, f"{t} registered by {seen.get(t)} and {cls.__name__}"
            seen[t] = cls.__name__


def test_registration_is_idempotent_and_rejects_a_clash() -> None:
    reg = register_builtins(PluginRegistry())
    n = len(reg.known_types())
    register_builtins(reg)
    assert len(reg.known_types()) == n

    class Impostor(Plugin):
        type_name = "queue-scorer"

    with pytest.raises(ValueError, match="'queue-scorer' is already registered"):
        reg.register(Impostor)
