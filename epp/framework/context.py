"""What a plugin may see of the running EPP: the endpoint view, shared services, and startup requests."""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from epp.framework.params import Params
from epp.framework.services import NoServices, Services
from epp.framework.state import DataKey
from epp.framework.types import Endpoint

T = TypeVar("T")

# A long-running coroutine the server starts at startup and cancels at shutdown.
BackgroundTask = Callable[[], Coroutine[Any, Any, None]]


class EndpointListener(Protocol):
    """Endpoint changes, as the Datastore applies them."""

    def endpoint_added(self, endpoint: Endpoint) -> None: ...

    def endpoint_updated(self, endpoint: Endpoint) -> None:
        """`endpoint` (the object added before) got other labels or attributes in place. Its name, address and
        ports are the same: a change of those is endpoint_removed + endpoint_added."""
        ...

    def endpoint_removed(self, endpoint: Endpoint) -> None: ...


class RemovalListener:
    """An EndpointListener for state kept per endpoint that only needs dropping when the endpoint leaves: an added
    endpoint has nothing yet, and one relabelled in place is the same server with the same state."""

    def endpoint_added(self, endpoint: Endpoint) -> None:
        return None

    def endpoint_updated(self, endpoint: Endpoint) -> None:
        return None

    def endpoint_removed(self, endpoint: Endpoint) -> None:
        raise NotImplementedError


class EndpointView(Protocol):
    """Read access to the pool's current endpoints, plus change notifications."""

    def endpoints(self) -> Sequence[Endpoint]: ...

    def get(self, name: str) -> Endpoint | None: ...

    def get_by_hostport(self, hostport: str) -> Endpoint | None: ...

    def subscribe(self, listener: EndpointListener) -> None: ...


@dataclass(slots=True)
class PluginRequirement:
    """A producer a plugin needs: built (as `type` named `name`) unless a configured plugin produces `key`."""

    key: DataKey[Any]
    type: str
    name: str
    parameters: dict[str, Any] = field(default_factory=dict)
    requested_by: str = ""
    # The asker's own parameter these parameters came from (e.g. `indexerConfig.tokenizersPoolConfig`): a configured
    # producer of `key` then leaves them unused, and the load says so.
    source: str = ""


@dataclass(frozen=True, slots=True)
class Feed(Generic[T]):
    """Data one plugin type produces for others (the contracts in `epp.plugins.contracts`): the per-producer key,
    the parameter a consumer names its producer by, and the producer type it gets when it names none."""

    key: DataKey[T]
    parameter: str
    default: str

    def of(self, producer: str) -> DataKey[T]:
        """The key as the producer named `producer` writes it."""
        return self.key.of(producer)


@dataclass
class PluginContext:
    """Handed to every plugin factory."""

    endpoints: EndpointView
    services: Services = field(default_factory=NoServices)
    pool_name: str = "default"
    # Long-running coroutines plugins and services asked for (started by the server).
    background: list[BackgroundTask] = field(default_factory=list)
    # Producers the config builder adds when nothing configured produces their key (GIE auto-adds producers).
    requirements: list[PluginRequirement] = field(default_factory=list)

    def require_producer(
        self,
        key: DataKey[Any],
        type_name: str,
        name: str,
        parameters: Mapping[str, Any] | None = None,
        *,
        requested_by: str = "",
        source: str = "",
    ) -> None:
        """Ask for a producer of `key` (e.g. prefix-cache-scorer → approx-prefix-cache-producer)."""
        if all(r.key != key for r in self.requirements):
            self.requirements.append(
                PluginRequirement(key, type_name, name, dict(parameters or {}), requested_by, source)
            )

    def producer_for(
        self,
        feed: Feed[Any],
        params: Params,
        *,
        requested_by: str,
        parameters: Mapping[str, Any] | None = None,
        add_default: bool = True,
    ) -> str:
        """The name of the producer that feeds a consumer: the one its `feed.parameter` names (the builder then
        checks it is configured), else `feed.default`, added with `parameters` unless a configured plugin already
        produces its key (`add_default=False` when the consumer can run without it)."""
        name = params.str(feed.parameter, "")
        if name:
            return name
        if add_default:
            self.require_producer(
                feed.of(feed.default), feed.default, feed.default, parameters, requested_by=requested_by
            )
        return feed.default

    def run_in_background(self, task: BackgroundTask) -> None:
        """Run `task()` for the server's lifetime (e.g. an event subscription, a tokenizer preload)."""
        self.background.append(task)
