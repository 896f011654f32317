"""Helpers shared by the unit tests."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
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


def install_distribution(
    site: Path,
    name: str,
    version: str,
    entry_points: Mapping[str, Mapping[str, str]],
    modules: Mapping[str, str] | None = None,
) -> Path:
    """Lay out in `site` what `pip install --target site` would: the modules (file name → source) and a
    `<name>-<version>.dist-info` with METADATA and entry_points.txt (group → {entry point name: "module:attr"}).

    With `site` on sys.path, importlib.metadata finds the distribution and its entry points, as in a real install.
    """
    site.mkdir(parents=True, exist_ok=True)
    for filename, source in (modules or {}).items():
        (site / filename).write_text(source)
    dist_info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    groups = [
        f"[{group}]\n" + "".join(f"{ep} = {target}\n" for ep, target in eps.items())
        for group, eps in entry_points.items()
    ]
    (dist_info / "entry_points.txt").write_text("\n".join(groups))
    return dist_info
