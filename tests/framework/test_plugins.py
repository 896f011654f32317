"""The Plugin base: its declared capabilities default off, and the stability levels gate the anchor's Alpha types."""

from __future__ import annotations

from collections.abc import Sequence

from epp.framework import (
    DataProducer,
    Endpoint,
    InferenceRequest,
    Plugin,
    PluginRegistry,
    PreRequest,
    ProfileHandler,
    ResponseComplete,
    SaturationDetector,
    SchedulingResult,
    Stability,
)
from epp.wiring import register_builtins

# The types llm-d-router v0.10 registers with StabilityAlpha (cmd/epp/runner/runner.go): loading one needs
# --allow-experimental-plugins there and here.
ANCHOR_ALPHA_TYPES = {
    "disaggregatedset-rollout-screener", "session-affinity-filter", "endpoint-attribute-filter",
    "topology-affinity-filter", "utilization-filter", "session-affinity-scorer", "header-label-affinity-scorer",
    "topology-extractor", "dcgm-data-source", "dcgm-extractor", "header-profile-handler",
    "endpoint-attribute-scorer", "topology-affinity-scorer", "burst-prefix-cache-producer", "p2p-source-producer",
    "multicluster-session-affinity-filter", "multicluster-queue-scorer",
    "multicluster-kv-cache-utilization-scorer", "multicluster-prefix-cache-scorer",
    "multicluster-approx-prefix-cache-producer", "sheddable-eviction-filter",
    "priority-then-time-eviction-order-policy", "priority-holdback-policy", "soft-reflective-ceiling-policy",
    "multicluster-metrics-data-source", "multicluster-metrics-extractor", "multicluster-file-discovery",
    "agent-identity",
}  # fmt: skip


def builtin_classes() -> dict[str, type[Plugin]]:
    """Registered type name → the built-in class behind it (every built-in registers its `from_config`)."""
    reg = register_builtins(PluginRegistry())
    out: dict[str, type[Plugin]] = {}
    for name in reg.known_types():
        cls = getattr(reg.factory(name), "__self__", None)
        assert isinstance(cls, type) and issubclass(cls, Plugin), name
        out[name] = cls
    return out


def test_the_alpha_types_are_the_anchors_and_every_other_type_is_stable() -> None:
    classes = builtin_classes()
    alpha = {cls.type_name for cls in classes.values() if cls.stability is Stability.ALPHA}
    assert alpha == ANCHOR_ALPHA_TYPES
    for name, cls in classes.items():  # an alias is as stable as the type it names
        assert cls.stability is (Stability.ALPHA if cls.type_name in ANCHOR_ALPHA_TYPES else Stability.STABLE), name
    assert f"{Stability.ALPHA}" == "Alpha"  # the level's name in the anchor's error message


class Bare(Plugin):
    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None:
        pass

    async def prepare(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> None:
        pass

    def response_complete(self, request: InferenceRequest, endpoint: Endpoint | None, usage: object) -> None:
        pass

    def saturation(self, endpoints: Sequence[Endpoint]) -> float:
        return 0.0


def test_a_plugin_has_each_role_without_declaring_any_capability() -> None:
    """The roles' optional capabilities come with their defaults from the base: implementing the method suffices."""
    p = Bare("bare")
    assert isinstance(p, PreRequest) and isinstance(p, DataProducer) and isinstance(p, ResponseComplete)
    assert isinstance(p, SaturationDetector) and not isinstance(p, ProfileHandler)
    assert (p.records_only, p.produce_timeout, p.writes_response_metadata, p.live_saturation) == (
        False,
        0.0,
        False,
        False,
    )
    assert p.max_profiles is None and p.stability is Stability.STABLE
