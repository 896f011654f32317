"""The framework: the only module plugins import (types, interfaces, registry, errors)."""

from epp.framework.context import EndpointListener, EndpointView, PluginContext
from epp.framework.errors import BadRequest, InternalError, RequestError, ServiceUnavailable, TooManyRequests
from epp.framework.plugins import (
    DataProducer,
    Filter,
    Picker,
    Plugin,
    PreRequest,
    ProfileHandler,
    ResponseComplete,
    Scorer,
)
from epp.framework.registry import get_factory, known_types, register
from epp.framework.types import (
    CycleState,
    Endpoint,
    InferenceRequest,
    Metrics,
    ProfileResult,
    SchedulingResult,
    Usage,
    join_host_port,
)

__all__ = [
    "BadRequest",
    "CycleState",
    "DataProducer",
    "Endpoint",
    "EndpointListener",
    "EndpointView",
    "Filter",
    "InferenceRequest",
    "InternalError",
    "Metrics",
    "Picker",
    "Plugin",
    "PluginContext",
    "PreRequest",
    "ProfileHandler",
    "ProfileResult",
    "RequestError",
    "ResponseComplete",
    "SchedulingResult",
    "Scorer",
    "ServiceUnavailable",
    "TooManyRequests",
    "Usage",
    "get_factory",
    "join_host_port",
    "known_types",
    "register",
]
