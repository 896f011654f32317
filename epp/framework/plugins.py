"""Plugin interfaces: the extension points of the scheduling cycle and the request lifecycle.

A plugin class may implement several of these (e.g. a Scorer that is also a PreRequest hook);
the scheduler finds the roles with isinstance() checks against these runtime-checkable protocols.
Optional behaviour within a role is declared, never probed: an attribute with its default on `Plugin` (e.g.
`records_only`, `max_profiles`, `stability`) that a plugin overrides, or a small protocol a plugin implements (e.g.
`PriorityCeilings`, `ExtractorHost`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from enum import StrEnum
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, Self, runtime_checkable

from epp.framework.params import Params
from epp.framework.state import CycleState, DataKey
from epp.framework.types import (
    Endpoint,
    InferenceRequest,
    ProfileResult,
    Response,
    ResponseChunk,
    SchedulingResult,
    Usage,
)

if TYPE_CHECKING:
    from epp.framework.context import PluginContext


class Stability(StrEnum):
    """A plugin type's stability level (llm-d-router's StabilityLevel): an Alpha type loads only with
    --allow-experimental-plugins."""

    ALPHA = "Alpha"
    BETA = "Beta"
    STABLE = "Stable"


class Plugin:
    """Base class: every configured plugin instance has a `type` (registry key) and a unique `name`.

    A subclass sets `type_name` (and `aliases`, older names of the same type) and overrides `from_config` when it
    takes parameters. `produces()`/`consumes()` declare the request data it writes and needs (epp.framework.keys).
    The attributes below declare optional behaviour; a plugin that has it overrides the default (the protocol that
    reads one says what it means).
    """

    type_name: ClassVar[str] = ""
    aliases: ClassVar[tuple[str, ...]] = ()
    stability: ClassVar[Stability] = Stability.STABLE
    # PreRequest: the hook only records the pick (see PreRequest).
    records_only: bool = False
    # DataProducer: the seconds `prepare` may wait on purpose; the director's producer budget grows to it.
    produce_timeout: float = 0.0
    # ResponseComplete: the hook's output goes out with the last response body message (see ResponseComplete).
    writes_response_metadata: bool = False
    # ProfileHandler: the most scheduling profiles it can run (None: any number); the builder checks the config.
    max_profiles: int | None = None
    # SaturationDetector: the signal comes from counts the EPP keeps itself, current as soon as a request ends
    # (no scrape to wait for before capacity freed by an eviction shows).
    live_saturation: bool = False

    def __init__(self, name: str | None = None) -> None:
        self.name = name or self.type_name

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        """Build an instance from its config entry; a plugin without parameters needs no override."""
        return cls(name)

    def produces(self) -> Collection[DataKey[Any]]:
        """Keys this plugin writes to `request.data` before scheduling (DataProducers)."""
        return ()

    def consumes(self) -> Collection[DataKey[Any]]:
        """Keys this plugin needs in `request.data`; some configured producer must produce each one."""
        return ()

    def uses(self) -> Collection[DataKey[Any]]:
        """Keys this plugin reads when some producer writes them (optional): a producer runs after theirs."""
        return ()

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

    @property
    def max_profiles(self) -> int | None: ...

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
class DisaggDecider(Protocol):
    """Decides per request whether a disaggregated stage runs (prefill: P/D; encode: E/P/D).

    `endpoint` is the pod an earlier stage picked (decode-first: the decode pod), or None.
    """

    name: str

    def disaggregate(self, state: CycleState, request: InferenceRequest, endpoint: Endpoint | None) -> bool: ...


@runtime_checkable
class ReferencesPlugins(Protocol):
    """A plugin that names other plugins in its parameters (e.g. a profile handler's deciders).

    The builder calls `resolve_plugins` once every configured plugin exists (whatever their order in the file);
    it raises PluginConfigError (with the key) for a missing or unfit plugin.
    """

    name: str

    def resolve_plugins(self, plugins: Mapping[str, Plugin], context: PluginContext) -> None: ...


@runtime_checkable
class AdmissionScope(Protocol):
    """A profile handler whose requests do not all need every candidate: admission measures saturation over
    `admission_endpoints(candidates)` (P/D: the decode pods every request needs, not an optional prefill pool)."""

    name: str

    def admission_endpoints(self, request: InferenceRequest, candidates: Sequence[Endpoint]) -> Sequence[Endpoint]: ...


@runtime_checkable
class RequestHeaderProcessor(Protocol):
    """Runs first, on the parsed request, before admission (e.g. agent-identity: a fairness id from headers)."""

    name: str

    def process_request_headers(self, request: InferenceRequest) -> None: ...


@runtime_checkable
class Screener(Protocol):
    """Runs once per request before admission and every profile: narrows the candidates for all of them (e.g. to
    one rollout revision). It raises ServiceUnavailable to fail closed."""

    name: str

    def screen(self, request: InferenceRequest, candidates: Sequence[Endpoint]) -> list[Endpoint]: ...


@runtime_checkable
class DataProducer(Protocol):
    """Runs before scheduling (may await, e.g. tokenization off the event loop); fills request.data.

    The builder orders producers so that each runs after the producers of the keys it consumes. One that waits on
    purpose (a batching window) sets `produce_timeout` to that wait.
    """

    name: str

    @property
    def produce_timeout(self) -> float: ...

    async def prepare(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> None: ...


@runtime_checkable
class PreRequest(Protocol):
    """Runs after a pick, before the request is forwarded (e.g. record the choice in an index).

    A hook that only records the pick for later requests (an index entry, an in-flight booking) and writes nothing
    the answer to Envoy carries (no upstream header, no request data read before the answer) sets `records_only =
    True`: behind the gateway the director then runs it once the answer is written, or before the next request is
    scheduled or any response hook runs, whichever comes first. Later picks see exactly what they saw before; the
    answer no longer waits for the bookkeeping."""

    name: str

    @property
    def records_only(self) -> bool: ...

    def pre_request(self, request: InferenceRequest, result: SchedulingResult) -> None: ...


@runtime_checkable
class ResponseComplete(Protocol):
    """Runs when the response has ended (usage known if the server reported it).

    A hook whose output goes out with the last response body message (dynamic metadata) sets
    `writes_response_metadata = True`: the director then runs the hooks before that message is answered."""

    name: str

    @property
    def writes_response_metadata(self) -> bool: ...

    def response_complete(self, request: InferenceRequest, endpoint: Endpoint | None, usage: Usage | None) -> None: ...


@runtime_checkable
class Admitter(Protocol):
    """Runs after the data producers, before scheduling: a deny reason rejects the request (429), None admits."""

    name: str

    def admit(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> str | None: ...


@runtime_checkable
class ResponseStreaming(Protocol):
    """Runs on every response body chunk (the last one too, before ResponseComplete). Keep it cheap."""

    name: str

    def response_chunk(self, request: InferenceRequest, chunk: ResponseChunk, endpoint: Endpoint | None) -> None: ...


@runtime_checkable
class ResponseReceived(Protocol):
    """Runs when the response headers arrive; may add headers for the client (`response.set_headers`)."""

    name: str

    def response_received(self, request: InferenceRequest, response: Response, endpoint: Endpoint | None) -> None: ...


@runtime_checkable
class SaturationDetector(Protocol):
    """Admission's view of load: 0 = idle, >= 1.0 = saturated (sheddable requests are then rejected).

    `live_saturation`: the signal is the EPP's own counts (current when a request ends), not a scrape."""

    name: str

    @property
    def live_saturation(self) -> bool: ...

    def saturation(self, endpoints: Sequence[Endpoint]) -> float: ...


@runtime_checkable
class FairnessPolicy(Protocol):
    """Flow control: how a priority band picks the next flow. `strict` = one FCFS order across its flows."""

    name: str
    strict: bool


@runtime_checkable
class OrderingPolicy(Protocol):
    """Flow control: the order of requests within one flow."""

    name: str
    ordering: str


@runtime_checkable
class UsageLimitPolicy(Protocol):
    """Flow control: dispatch is held while the pool's saturation is at or above `threshold`."""

    name: str
    threshold: float


@runtime_checkable
class PriorityCeilings(Protocol):
    """A usage-limit policy that is priority-aware: one saturation ceiling per active priority."""

    name: str

    def ceilings(self, saturation: float, priorities: list[int]) -> list[float]:
        """Per priority in `priorities` (highest first), the saturation at or above which its dispatch is held."""
        ...


@runtime_checkable
class FlowPicker(Protocol):
    """A fairness policy that chooses the next flow itself (without one: the flow whose head waited longest)."""

    name: str

    def pick_flow(self, flows: Mapping[str, tuple[int, float]]) -> str | None:
        """The flow to dispatch from, given fairness id → (queued requests, head's enqueue time); None: the default."""
        ...


@runtime_checkable
class DeadlineOrdering(Protocol):
    """An ordering policy that orders a flow's requests by a deadline (earliest first) and expires them at it."""

    name: str

    def deadline(self, request: InferenceRequest, enqueued: float, ttl: float | None) -> float: ...


@runtime_checkable
class ExtractorHost(Protocol):
    """A data source that feeds extractors: `dataLayer.sources[].extractors` are handed to it once built; it raises
    ValueError for one it cannot feed."""

    name: str

    def attach_extractors(self, extractors: Sequence[Plugin]) -> None: ...


@runtime_checkable
class CrossReplicaContributor(Protocol):
    """Per-endpoint state shared with the other EPP replicas through the configured cross-replica syncer
    (`dataLayer.crossReplicaSyncerPluginRef`). Values are lists of ints per endpoint name, summed across replicas."""

    name: str

    def cross_replica_key(self) -> str | None:
        """The namespace of this state in the shared store; None opts out (the local value is used as is)."""
        ...

    def cross_replica_snapshot(self) -> dict[str, list[int]]:
        """This replica's current values, endpoint name → values."""
        ...

    def cross_replica_update(self, remote: Mapping[str, list[int]]) -> None:
        """The sum over the other live replicas, endpoint name → values (absent = 0)."""
        ...


@runtime_checkable
class CrossReplicaMessenger(Protocol):
    """Events the other EPP replicas should learn as they happen, not once per sync interval (e.g. the precise
    prefix producer's pick: "this prompt's blocks are being computed on that pod"). Messages are small JSON values,
    broadcast best-effort by the syncers that carry messages (a lost one only costs routing quality)."""

    name: str

    def cross_replica_channel(self) -> str | None:
        """The channel's name in the shared store; None opts out."""
        ...

    def cross_replica_connect(self, send: Callable[[Any], None]) -> None:
        """`send(message)` queues one message for the other replicas; it never blocks and may drop when full."""
        ...

    def cross_replica_receive(self, message: Any) -> None:
        """One message another replica sent (already parsed JSON, not yet validated: check its shape)."""
        ...

    def cross_replica_reset(self) -> None:
        """The link to the other replicas was lost (messages may have been dropped): forget what they sent that
        would only be undone by a later message."""
        ...


@runtime_checkable
class CrossReplicaMessageCarrier(Protocol):
    """A cross-replica syncer that also broadcasts messengers' events as they happen."""

    name: str

    def attach_messengers(self, messengers: Sequence[CrossReplicaMessenger]) -> None: ...


@runtime_checkable
class CrossReplicaSyncer(Protocol):
    """Publishes the contributors' snapshots every `interval` seconds and feeds back the other replicas' sums."""

    name: str

    def attach(self, contributors: Sequence[CrossReplicaContributor], interval: float | None) -> None: ...
