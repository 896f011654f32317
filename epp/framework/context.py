"""What a plugin may see of the running EPP: the endpoint view and named shared services."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from epp.framework.types import Endpoint


class EndpointListener(Protocol):
    def endpoint_added(self, endpoint: Endpoint) -> None: ...

    def endpoint_removed(self, endpoint: Endpoint) -> None: ...


class EndpointView(Protocol):
    """Read access to the pool's current endpoints, plus change notifications."""

    def endpoints(self) -> Sequence[Endpoint]: ...

    def get(self, name: str) -> Endpoint | None: ...

    def subscribe(self, listener: EndpointListener) -> None: ...


@dataclass
class PluginContext:
    """Handed to every plugin factory. `services` holds shared objects by key (e.g. "kv-index")."""

    endpoints: EndpointView
    pool_name: str = "default"
    services: dict[str, Any] = field(default_factory=dict)
    # Background coroutines a plugin wants run for the server's lifetime (started by the server).
    background: list[Callable[[], Any]] = field(default_factory=list)
    # Plugins the config builder must add if no plugin of that name is configured (GIE auto-adds producers).
    requirements: list[PluginRequirement] = field(default_factory=list)

    def require_plugin(self, type_name: str, name: str, parameters: dict[str, Any] | None = None) -> None:
        """Ask for a helper plugin (e.g. the approximate prefix producer) to be instantiated with the config."""
        if all(r.name != name for r in self.requirements):
            self.requirements.append(PluginRequirement(type_name, name, dict(parameters or {})))

    def service(self, key: str, factory: Callable[[], Any] | None = None) -> Any:
        """Get a shared service, creating it once with `factory` if absent."""
        if key not in self.services:
            if factory is None:
                raise KeyError(f"service {key!r} is not available")
            self.services[key] = factory()
        return self.services[key]


@dataclass(slots=True)
class PluginRequirement:
    """A plugin another plugin needs (e.g. prefix-cache-scorer needs a producer); built unless already configured."""

    type: str
    name: str
    parameters: dict[str, Any] = field(default_factory=dict)
