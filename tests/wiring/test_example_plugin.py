"""The example third-party plugins (examples/plugins/) as a user runs them: installed as a distribution whose
`epp.plugins` entry points come from its own pyproject.toml, found by the registry, built from an
EndpointPickerConfig and deciding the pick; the second reads a prefix producer's matches through
`epp.plugins.contracts`. CONTRIBUTING.md shows these same files, byte for byte.
"""

from __future__ import annotations

import ast
import asyncio
import importlib.metadata
import re
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from epp.config import ConfigError, load_config, parse_config
from epp.datalayer.datastore import Datastore
from epp.framework import ApiKind, Endpoint, InferenceRequest, Metrics, PluginRegistry
from epp.requestcontrol.director import SchedulingDirector
from epp.wiring import build_pipeline, plugin_context, register_builtins
from tests.helpers import install_distribution

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "plugins"
MODULE = EXAMPLE / "epp_kv_headroom.py"
WARM = EXAMPLE / "epp_warm_prefix.py"
CONFIG = EXAMPLE / "epp-config.yaml"
PYPROJECT = EXAMPLE / "pyproject.toml"
TYPE = "kv-headroom-scorer"


@pytest.fixture
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[PluginRegistry]:
    """A fresh registry with the built-ins and the example installed as its pyproject.toml declares it: its
    modules and a dist-info with its entry points in a site directory on sys.path (the shared venv is untouched)."""
    project = tomllib.loads(PYPROJECT.read_text())
    meta = project["project"]
    modules = project["tool"]["setuptools"]["py-modules"]
    site = tmp_path / "site-packages"
    install_distribution(
        site,
        meta["name"],
        meta["version"],
        meta["entry-points"],
        {f"{m}.py": (EXAMPLE / f"{m}.py").read_text() for m in modules},
    )
    monkeypatch.syspath_prepend(str(site))
    yield register_builtins(PluginRegistry())
    for m in modules:
        sys.modules.pop(m, None)


def request() -> InferenceRequest:
    return InferenceRequest("r1", "/v1/completions", ApiKind.COMPLETIONS, "m", "m", {"prompt": "hi"}, prompt="hi")


def endpoint(name: str, kv: float, queue: int) -> Endpoint:
    return Endpoint(name, "10.0.0.1", 8000, metrics=Metrics(kv_cache_usage_percent=kv, waiting_queue_size=queue))


def test_the_example_config_schedules_with_the_entry_point_plugin(registry: PluginRegistry) -> None:
    pipeline = build_pipeline(load_config(CONFIG), plugin_context(Datastore()), registry)
    plugin = pipeline.plugins[TYPE]
    assert type(plugin).__module__ == "epp_kv_headroom"
    assert plugin.type_name == TYPE  # the entry point's name (the type in configs) matches the class's type_name
    assert Path(sys.modules["epp_kv_headroom"].__file__ or "").parent.name == "site-packages"  # the installed copy
    assert plugin.threshold == 0.9  # type: ignore[attr-defined]  # from the yaml, not the default 0.8

    # Headroom x 3 + queue-scorer x 1. Endpoint b has the shortest queue but its cache is past the threshold;
    # c is half way to it. Queue scores (min-max inverted over 6, 0, 3): a 0, b 1, c 0.5.
    a, b, c = endpoint("a", kv=0.0, queue=6), endpoint("b", kv=0.95, queue=0), endpoint("c", kv=0.45, queue=3)
    result = pipeline.scheduler.schedule(request(), [a, b, c])
    assert result.targets == [a, c, b]  # best first, then the fallbacks
    assert result.profile_results["default"].scores == pytest.approx({"a": 3.0, "b": 1.0, "c": 0.5 * 3 + 0.5})


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("1.5", "must be <= 1.0, got 1.5"),
        ("0", "must be > 0.0, got 0"),
        ("lots", "expected a number, got 'lots'"),
    ],
)
def test_a_bad_parameter_names_the_key_and_its_line(registry: PluginRegistry, value: str, message: str) -> None:
    lines = CONFIG.read_text().splitlines()
    line = next(i for i, text in enumerate(lines, 1) if text.strip() == "threshold: 0.9")
    lines[line - 1] = lines[line - 1].replace("0.9", value)
    config = parse_config("\n".join(lines) + "\n", source=str(CONFIG))
    with pytest.raises(ConfigError) as ei:
        build_pipeline(config, plugin_context(Datastore()), registry)
    assert str(ei.value) == (
        f"{CONFIG}:{line}: plugins[0].parameters.threshold: {TYPE}: parameter 'threshold': {message}"
    )


def test_without_the_entry_point_the_type_is_unknown() -> None:
    try:
        importlib.metadata.distribution("epp-kv-headroom")
    except importlib.metadata.PackageNotFoundError:
        pass
    else:
        pytest.skip("the example package is installed in this environment")
    with pytest.raises(ConfigError, match=rf"{CONFIG}:6: plugins\[0\].type: unknown plugin type '{TYPE}'"):
        build_pipeline(load_config(CONFIG), plugin_context(Datastore()), register_builtins(PluginRegistry()))


def epp_imports(module: Path) -> set[str]:
    tree = ast.parse(module.read_text())
    imported = {n.name for node in ast.walk(tree) if isinstance(node, ast.Import) for n in node.names}
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    return {m for m in imported if m.split(".")[0] == "epp"}


def test_the_example_plugins_import_only_the_framework_and_the_contracts() -> None:
    assert epp_imports(MODULE) == {"epp.framework"}
    assert epp_imports(WARM) == {"epp.framework", "epp.plugins.contracts.prefix"}


WARM_CONFIG = """
plugins:
- type: warm-prefix-scorer
  parameters: {minShare: 0.5}
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: warm-prefix-scorer
  - pluginRef: max-score-picker
"""


async def test_the_warm_prefix_scorer_reads_the_producer_it_gets(registry: PluginRegistry) -> None:
    """No prefix producer configured: the builder adds the one the contract names; after a pick, the same prompt
    scores 1.0 on the endpoint it went to and 0 elsewhere."""
    ds = Datastore()
    ds.replace_all([Endpoint(n, f"10.0.0.{i}", 8000) for i, n in enumerate(("a", "b", "c"), 1)])
    pipeline = build_pipeline(parse_config(WARM_CONFIG), plugin_context(ds), registry)
    assert "approx-prefix-cache-producer" in pipeline.plugins
    director = SchedulingDirector(ds, pipeline)
    prompt = "The same long system prompt, sent again by the next request of the session. " * 40

    def req(rid: str) -> InferenceRequest:
        return InferenceRequest(
            rid, "/v1/completions", ApiKind.COMPLETIONS, "m", "m", {"prompt": prompt}, prompt=prompt
        )

    first = await director.handle_request(req("r1"))
    await asyncio.sleep(0)  # the producer records the pick right after the decision
    second = await director.handle_request(req("r2"))
    assert second.endpoints[0].name == first.endpoints[0].name
    assert second.result is not None
    scores = {ep.name: score for ep, score in second.result.profile_results["default"].candidates}
    assert scores == {n: float(n == first.endpoints[0].name) for n in "abc"}


def test_naming_a_producer_that_is_not_configured_is_an_error(registry: PluginRegistry) -> None:
    text = WARM_CONFIG.replace("{minShare: 0.5}", "{minShare: 0.5, prefixMatchInfoProducerName: mine}")
    with pytest.raises(ConfigError, match="warm-prefix-scorer"):
        build_pipeline(parse_config(text), plugin_context(Datastore()), registry)


def test_contributing_shows_the_example_files_verbatim() -> None:
    """Each `<!-- file: PATH -->` in CONTRIBUTING.md is followed by a fenced block holding exactly that file."""
    text = (ROOT / "CONTRIBUTING.md").read_text()
    shown = dict(re.findall(r"<!-- file: (\S+) -->\n```[a-z]*\n(.*?)```\n", text, flags=re.DOTALL))
    assert set(shown) == {
        "examples/plugins/epp_kv_headroom.py",
        "examples/plugins/epp_warm_prefix.py",
        "examples/plugins/pyproject.toml",
        "examples/plugins/epp-config.yaml",
    }
    for path, block in shown.items():
        assert block == (ROOT / path).read_text(), f"CONTRIBUTING.md's copy of {path} differs from the file"
    # "Write a plugin in 30 lines": the whole module, docstring and imports included.
    assert len(MODULE.read_text().splitlines()) <= 30
    assert "## Write a plugin in 30 lines" in text
