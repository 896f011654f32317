"""Plugin interfaces: the extension points of the scheduling cycle and the request lifecycle.

A plugin class may implement several of these (e.g. a Scorer that is also a PreRequest hook);
the scheduler finds the roles with isinstance() checks against these runtime-checkable protocols.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from epp.framework.types import (
    CycleState,
    Endpoint,
    InferenceRequest,
    ProfileResult,
    SchedulingResult,
    Usage,
)


class Plugin:
    """Base class: every configured plugin instance has a `type` (registry key) and a unique `name`."""

    type_name: str = ""

    def __init__(self, name: str | None = None) -> None:
        self.name = name or self.type_name

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


@runtime_checkable
class Filter(Protocol):
    name: str

    def filter(self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[Endpoint]: ...


@runtime_checkable
class Scorer(Protocol):
    """Returns one score per endpoint, aligned with `endpoints`; the scheduler clamps to [0, 1]."""

    name: str

    def score(self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> Sequence[float]: ...


@runtime_checkable
class Picker(Protocol):
    """Chooses targets (best first) from endpoints and their weighted total scores."""

    name: str

    def pick(
        self, state: CycleState, request: InferenceRequest, scored: Sequence[tuple[Endpoint, float]]
    ) -> ProfileResult: ...


@runtime_checkable
class ProfileHandler(Protocol):
    """Decides which profiles run (possibly over several rounds) and which result is primary."""

    name: str

    def pick_profiles(
        self,
        state: CycleState,
        request: InferenceRequest,
        profiles: Mapping[str, Any],
        results: Mapping[str, ProfileResult | None],
    ) -> list[str]: ...

    def process_results(
        self, state: CycleState, request: InferenceRequest, results: Mapping[str, ProfileResult | None]
    ) -> SchedulingResult: ...


@runtime_checkable
class DataProducer(Protocol):
    """Runs before scheduling (may await, e.g. tokenization off the event loop); fills request.data."""

    name: str

    async def prepare(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> None: ...


@runtime_checkable
class PreRequest(Protocol):
    """Runs after a pick, before the request is forwarded (e.g. record the choice in an index)."""

    name: str

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None: ...


@runtime_checkable
class ResponseComplete(Protocol):
    """Runs when the response has ended (usage known if the server reported it)."""

    name: str

    def response_complete(self, request: InferenceRequest, endpoint: Endpoint | None, usage: Usage | None) -> None: ...


@runtime_checkable
class ResponseReceived(Protocol):
    """Runs when the response headers arrive (`status` is the HTTP status of the model server)."""

    name: str

    def response_received(self, request: InferenceRequest, endpoint: Endpoint | None, status: int) -> None: ...


@runtime_checkable
class SaturationDetector(Protocol):
    """Admission's view of load: 0 = idle, >= 1.0 = saturated (sheddable requests are then rejected)."""

    name: str

    def saturation(self, endpoints: Sequence[Endpoint]) -> float: ...
