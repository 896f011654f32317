"""PluginRegistry.load_entry_points: third-party plugin types from the `epp.plugins` entry-point group.

Each test lays out an installed distribution (modules + dist-info) in a fresh directory on sys.path, so the
registry finds its entry points through importlib.metadata exactly as it finds a pip-installed package's.
"""

from __future__ import annotations

import logging
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from epp.datalayer.datastore import Datastore
from epp.framework import ApiKind, Endpoint, InferenceRequest, Metrics, Params, Plugin, PluginRegistry, Scorer
from epp.framework.state import CycleState
from epp.plugins.scorers.queue_scorer import QueueScorer
from epp.wiring import plugin_context
from tests.helpers import install_distribution

GOOD_MODULE = textwrap.dedent(
    '''
    """A third-party plugin module: imports only epp.framework."""

    from epp.framework import Params, Plugin

    NOT_A_FACTORY = 42


    class RunningCapScorer(Plugin):
        type_name = "running-cap-scorer"

        def __init__(self, name=None, capacity=8):
            super().__init__(name)
            self.capacity = capacity

        @classmethod
        def from_config(cls, name, params, context):
            return cls(name, capacity=params.int("capacity", 8, min=1))

        def score(self, state, request, endpoints):
            return [max(0.0, 1.0 - ep.metrics.running_requests_size / self.capacity) for ep in endpoints]


    def make_constant_scorer(name, params, context):
        """A factory function (not a class) is an entry point too."""
        value = params.float("value", 0.5)
        scorer = RunningCapScorer(name)
        scorer.score = lambda state, request, endpoints: [value] * len(endpoints)
        return scorer
    '''
)

BROKEN_MODULE = 'raise RuntimeError("this plugin module is broken at import")\n'

OTHER_MODULE = textwrap.dedent(
    """
    from epp.framework import Plugin


    class OtherScorer(Plugin):
        type_name = "other-installed-scorer"
    """
)

MODULES = ("epp_test_good_plugins", "epp_test_broken_plugin", "epp_test_other_plugin")


@pytest.fixture(params=["alone", "beside another plugin"])
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Iterator[Path]:
    """A directory on sys.path standing for site-packages; the test modules are forgotten afterwards. The second
    variant has another plugin distribution installed already (as a user's venv with the CONTRIBUTING example has):
    the tests count only what their own distribution adds."""
    if request.param != "alone":
        other = tmp_path / "other-site"
        install_distribution(
            other, "epp-test-other-plugin", "1.0",
            {"epp.plugins": {"other-installed-scorer": "epp_test_other_plugin:OtherScorer"}},
            {"epp_test_other_plugin.py": OTHER_MODULE},
        )  # fmt: skip
        monkeypatch.syspath_prepend(str(other))
    site = tmp_path / "site"
    site.mkdir()  # before it is on sys.path: a missing directory's finder is cached as none
    monkeypatch.syspath_prepend(str(site))
    yield site
    for m in MODULES:
        sys.modules.pop(m, None)


def installed_types() -> list[str]:
    """The plugin types every installed distribution adds before a test installs its own."""
    registry = PluginRegistry()
    registry.load_entry_points()
    return registry.known_types()


def request() -> InferenceRequest:
    return InferenceRequest("r1", "/v1/completions", ApiKind.COMPLETIONS, "m", "m", {"prompt": "hi"}, prompt="hi")


def test_an_entry_point_naming_a_plugin_class_builds_configured_instances(site: Path) -> None:
    before = installed_types()
    install_distribution(
        site,
        "epp-test-good-plugins",
        "1.0",
        {"epp.plugins": {"running-cap-scorer": "epp_test_good_plugins:RunningCapScorer"}},
        {"epp_test_good_plugins.py": GOOD_MODULE},
    )
    registry = PluginRegistry()
    assert registry.factory("running-cap-scorer") is None
    registry.load_entry_points()
    assert registry.known_types() == sorted([*before, "running-cap-scorer"])

    factory = registry.factory("running-cap-scorer")
    assert factory is not None
    plugin = factory("cap", Params("cap", {"capacity": 4}), plugin_context(Datastore()))
    assert isinstance(plugin, Plugin) and isinstance(plugin, Scorer)
    assert type(plugin).__module__ == "epp_test_good_plugins"
    assert (plugin.name, plugin.type_name) == ("cap", "running-cap-scorer")
    endpoints = [
        Endpoint(f"e{i}", "10.0.0.1", 8000 + i, metrics=Metrics(running_requests_size=n))
        for i, n in enumerate((0, 2, 6))
    ]
    assert list(plugin.score(CycleState(), request(), endpoints)) == [1.0, 0.5, 0.0]
    # The class's parameters go through Params like a built-in's: a bad one names the key.
    with pytest.raises(ValueError, match=r"cap: parameter 'capacity': must be >= 1, got 0"):
        factory("cap", Params("cap", {"capacity": 0}), plugin_context(Datastore()))


def test_broken_entry_points_are_logged_and_skipped(site: Path, caplog: pytest.LogCaptureFixture) -> None:
    before = installed_types()
    install_distribution(
        site,
        "epp-test-mixed-plugins",
        "1.0",
        {
            "epp.plugins": {
                "missing-module": "epp_test_no_such_module:Scorer",
                "raises-on-import": "epp_test_broken_plugin:Scorer",
                "missing-attribute": "epp_test_good_plugins:NoSuchClass",
                "not-a-factory": "epp_test_good_plugins:NOT_A_FACTORY",
                "queue-scorer": "epp_test_good_plugins:RunningCapScorer",  # shadows a registered type
                "running-cap-scorer": "epp_test_good_plugins:RunningCapScorer",
                "constant-scorer": "epp_test_good_plugins:make_constant_scorer",
            },
            "some.other.group": {"other-scorer": "epp_test_good_plugins:RunningCapScorer"},
        },
        {"epp_test_good_plugins.py": GOOD_MODULE, "epp_test_broken_plugin.py": BROKEN_MODULE},
    )
    registry = PluginRegistry()
    registry.register(QueueScorer)
    queue_factory = registry.factory("queue-scorer")

    with caplog.at_level(logging.WARNING, logger="epp.framework.registry"):
        registry.load_entry_points()  # does not raise

    # The good ones load (a class and a factory function); the broken ones are absent; the built-in keeps its type.
    ours = ["constant-scorer", "queue-scorer", "running-cap-scorer"]
    assert registry.known_types() == sorted({*before, *ours})
    assert registry.factory("queue-scorer") == queue_factory
    constant = registry.factory("constant-scorer")
    assert constant is not None
    scorer = constant("c", Params("c", {"value": 0.25}), plugin_context(Datastore()))
    assert list(scorer.score(CycleState(), request(), [Endpoint("e", "10.0.0.1", 8000)])) == [0.25]

    # Each broken entry point is logged, naming it; the import errors come with their traceback.
    logged = {r.getMessage(): r for r in caplog.records}
    for name, error in (
        ("missing-module", ModuleNotFoundError),
        ("raises-on-import", RuntimeError),
        ("missing-attribute", AttributeError),
    ):
        record = logged[f"failed to load plugin entry point {name}"]
        assert record.levelno == logging.ERROR
        assert record.exc_info is not None and isinstance(record.exc_info[1], error)
    assert logged["plugin entry point not-a-factory is neither a plugin class nor a factory"].levelno == logging.ERROR
    assert logged["plugin entry point queue-scorer ignored: the type is already registered"].levelno == logging.WARNING
    names = ("missing-module", "raises-on-import", "missing-attribute", "not-a-factory", "queue-scorer")
    assert len([r for r in caplog.records if set(names) & set(r.getMessage().split())]) == 5

    # Entry points are read once per registry.
    caplog.clear()
    registry.load_entry_points()
    assert caplog.records == []
    assert registry.known_types() == sorted({*before, *ours})
