"""The framework: the bottom layer and the only part of the EPP a plugin imports.

Types (`types`), typed request state (`state`, `keys`), plugin interfaces (`plugins`), parameters (`params`),
the context and services a plugin factory receives (`context`, `services`), request errors (`errors`) and the
registry of plugin types (`registry`). It imports nothing else from the EPP.
"""

from epp.framework.context import BackgroundTask, EndpointListener, EndpointView, PluginContext, PluginRequirement
from epp.framework.errors import (
    BadRequest,
    InternalError,
    RequestError,
    ServiceUnavailable,
    TokenizationError,
    TooManyRequests,
)
from epp.framework.keys import PREFIX_CACHE_MATCH_INFO, TOKENIZED_PROMPT
from epp.framework.params import Params, PluginConfigError, parse_duration
from epp.framework.plugins import (
    DataProducer,
    FairnessPolicy,
    Filter,
    OrderingPolicy,
    Picker,
    Plugin,
    PreRequest,
    ProfileHandler,
    ResponseComplete,
    ResponseReceived,
    SaturationDetector,
    Scorer,
    UsageLimitPolicy,
)
from epp.framework.registry import REGISTRY, PluginRegistry, get_factory, known_types
from epp.framework.services import KVCacheIndex, NoServices, Services, Tokenizer
from epp.framework.state import CycleState, DataKey, DataMap
from epp.framework.types import (
    Endpoint,
    InferenceRequest,
    Metrics,
    PrefixCacheMatchInfo,
    PrefixMatch,
    ProfileResult,
    Response,
    SchedulingResult,
    TokenizedPrompt,
    Usage,
    join_host_port,
)

__all__ = [
    "PREFIX_CACHE_MATCH_INFO",
    "REGISTRY",
    "TOKENIZED_PROMPT",
    "BackgroundTask",
    "BadRequest",
    "CycleState",
    "DataKey",
    "DataMap",
    "DataProducer",
    "Endpoint",
    "EndpointListener",
    "EndpointView",
    "FairnessPolicy",
    "Filter",
    "InferenceRequest",
    "InternalError",
    "KVCacheIndex",
    "Metrics",
    "NoServices",
    "OrderingPolicy",
    "Params",
    "Picker",
    "Plugin",
    "PluginConfigError",
    "PluginContext",
    "PluginRegistry",
    "PluginRequirement",
    "PreRequest",
    "PrefixCacheMatchInfo",
    "PrefixMatch",
    "ProfileHandler",
    "ProfileResult",
    "RequestError",
    "Response",
    "ResponseComplete",
    "ResponseReceived",
    "SaturationDetector",
    "SchedulingResult",
    "Scorer",
    "ServiceUnavailable",
    "Services",
    "TokenizationError",
    "TokenizedPrompt",
    "Tokenizer",
    "TooManyRequests",
    "Usage",
    "UsageLimitPolicy",
    "get_factory",
    "join_host_port",
    "known_types",
    "parse_duration",
]
