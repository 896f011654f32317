"""The built-in plugin types, registered explicitly: this list is the catalog.

`register_builtins()` is called once by the wiring (and by `epp validate`); it also loads third-party types from
the `epp.plugins` entry-point group. Nothing registers as a side effect of an import.
"""

from __future__ import annotations

from epp.datalayer.plugins.core_metrics_extractor import CoreMetricsExtractorPlugin
from epp.datalayer.plugins.dcgm_data_source import DCGMDataSource
from epp.datalayer.plugins.dcgm_extractor import DCGMExtractor
from epp.datalayer.plugins.endpoint_notification_source import EndpointNotificationSource
from epp.datalayer.plugins.local_syncer import LocalSyncer
from epp.datalayer.plugins.metrics_data_source import MetricsDataSource
from epp.datalayer.plugins.models_data_extractor import ModelsDataExtractor
from epp.datalayer.plugins.models_data_source import ModelsDataSource
from epp.datalayer.plugins.multicluster_metrics_data_source import MultiClusterMetricsDataSource
from epp.datalayer.plugins.multicluster_metrics_extractor import MultiClusterMetricsExtractor
from epp.datalayer.plugins.redis_cross_replica_syncer import RedisCrossReplicaSyncer
from epp.datalayer.plugins.topology_extractor import TopologyExtractor
from epp.datalayer.plugins.worker_state_syncer import WorkerStateSyncer
from epp.discovery.plugins.file_discovery import FileDiscovery
from epp.discovery.plugins.multicluster_file_discovery import MultiClusterFileDiscovery
from epp.framework import REGISTRY, Plugin, PluginRegistry
from epp.framework.parsing import ParserRegistry, RequestParser
from epp.plugins.admitters.latency_slo_admitter import LatencySLOAdmitter
from epp.plugins.deciders.always_disagg_multimodal_decider import AlwaysDisaggMultimodalDecider
from epp.plugins.deciders.always_disagg_pd_decider import AlwaysDisaggPDDecider
from epp.plugins.deciders.prefix_based_pd_decider import PrefixBasedPDDecider
from epp.plugins.filters.by_label import ByLabelFilter
from epp.plugins.filters.decode_filter import DecodeFilter
from epp.plugins.filters.encode_filter import EncodeFilter
from epp.plugins.filters.endpoint_attribute_filter import EndpointAttributeFilter
from epp.plugins.filters.header_based_testing_filter import HeaderBasedTestingFilter
from epp.plugins.filters.label_selector_filter import LabelSelectorFilter
from epp.plugins.filters.multicluster_session_affinity_filter import MultiClusterSessionAffinityFilter
from epp.plugins.filters.prefill_filter import PrefillFilter
from epp.plugins.filters.prefix_cache_affinity_filter import PrefixCacheAffinityFilter
from epp.plugins.filters.session_affinity_filter import SessionAffinityFilter
from epp.plugins.filters.slo_headroom_tier_filter import SLOHeadroomTierFilter
from epp.plugins.filters.topology_affinity_filter import TopologyAffinityFilter
from epp.plugins.filters.utilization_filter import UtilizationFilter
from epp.plugins.flowcontrol.edf_ordering_policy import EDFOrderingPolicy
from epp.plugins.flowcontrol.fcfs_ordering_policy import FCFSOrderingPolicy
from epp.plugins.flowcontrol.global_strict_fairness_policy import GlobalStrictFairnessPolicy
from epp.plugins.flowcontrol.priority_holdback_policy import PriorityHoldbackPolicy
from epp.plugins.flowcontrol.priority_then_time_eviction_order_policy import PriorityThenTimeEvictionOrderPolicy
from epp.plugins.flowcontrol.program_aware_fairness import ProgramAwareFairness
from epp.plugins.flowcontrol.round_robin_fairness_policy import RoundRobinFairnessPolicy
from epp.plugins.flowcontrol.sheddable_eviction_filter import SheddableEvictionFilter
from epp.plugins.flowcontrol.slo_deadline_ordering_policy import SLODeadlineOrderingPolicy
from epp.plugins.flowcontrol.soft_reflective_ceiling_policy import SoftReflectiveCeilingPolicy
from epp.plugins.flowcontrol.static_usage_limit_policy import StaticUsageLimitPolicy
from epp.plugins.parsers.anthropic_parser import AnthropicParser
from epp.plugins.parsers.openai_parser import OpenAIParser
from epp.plugins.parsers.passthrough_parser import PassthroughParser
from epp.plugins.parsers.sglanghttp_parser import SGLangHTTPParser
from epp.plugins.parsers.vertexai_parser import VertexAIParser
from epp.plugins.parsers.vllmgrpc_parser import VLLMGRPCParser
from epp.plugins.parsers.vllmhttp_parser import VLLMHTTPParser
from epp.plugins.pickers.max_score_picker import MaxScorePicker
from epp.plugins.pickers.random_picker import RandomPicker
from epp.plugins.pickers.round_robin_picker import RoundRobinPicker
from epp.plugins.pickers.weighted_random_picker import WeightedRandomPicker
from epp.plugins.prerequest.disagg_headers_handler import DisaggHeadersHandler
from epp.plugins.producers.approx_prefix_cache_producer import ApproxPrefixCacheProducer
from epp.plugins.producers.burst_prefix_cache_producer import BurstPrefixCacheProducer
from epp.plugins.producers.inflight_load_producer import InFlightLoadProducer
from epp.plugins.producers.mm_embeddings_cache_producer import MMEmbeddingsCacheProducer
from epp.plugins.producers.multicluster_approx_prefix_cache_producer import MultiClusterApproxPrefixCacheProducer
from epp.plugins.producers.p2p_source_producer import P2PSourceProducer
from epp.plugins.producers.precise_prefix_cache_producer import PrecisePrefixCacheProducer
from epp.plugins.producers.predicted_latency_producer import PredictedLatencyProducer
from epp.plugins.producers.session_id_producer import SessionIDProducer
from epp.plugins.producers.token_producer import TokenProducer
from epp.plugins.profiles.data_parallel_profile_handler import DataParallelProfileHandler
from epp.plugins.profiles.disagg_profile_handler import DisaggProfileHandler
from epp.plugins.profiles.header_profile_handler import HeaderProfileHandler
from epp.plugins.profiles.pd_profile_handler import PdProfileHandler
from epp.plugins.profiles.single_profile_handler import SingleProfileHandler
from epp.plugins.requestcontrol.agent_identity import AgentIdentity
from epp.plugins.requestcontrol.destination_endpoint_served_verifier import DestinationEndpointServedVerifier
from epp.plugins.requestcontrol.disaggregatedset_rollout_screener import DisaggregatedSetRolloutScreener
from epp.plugins.requestcontrol.probabilistic_admitter import ProbabilisticAdmitter
from epp.plugins.requestcontrol.request_attribute_reporter import RequestAttributeReporter
from epp.plugins.saturation.concurrency_detector import ConcurrencyDetector
from epp.plugins.saturation.utilization_detector import UtilizationDetector
from epp.plugins.scorers.active_request_scorer import ActiveRequestScorer
from epp.plugins.scorers.context_length_aware import ContextLengthAware
from epp.plugins.scorers.endpoint_attribute_scorer import EndpointAttributeScorer
from epp.plugins.scorers.header_label_affinity_scorer import HeaderLabelAffinityScorer
from epp.plugins.scorers.kv_cache_utilization_scorer import KVCacheUtilizationScorer
from epp.plugins.scorers.latency_scorer import LatencyScorer
from epp.plugins.scorers.load_aware_scorer import LoadAwareScorer
from epp.plugins.scorers.lora_affinity_scorer import LoraAffinityScorer
from epp.plugins.scorers.mm_embeddings_cache_scorer import MMEmbeddingsCacheScorer
from epp.plugins.scorers.multicluster_kv_cache_utilization_scorer import MultiClusterKVCacheUtilizationScorer
from epp.plugins.scorers.multicluster_prefix_cache_scorer import MultiClusterPrefixCacheScorer
from epp.plugins.scorers.multicluster_queue_scorer import MultiClusterQueueScorer
from epp.plugins.scorers.no_hit_lru_scorer import NoHitLRUScorer
from epp.plugins.scorers.precise_prefix_cache_scorer import PrecisePrefixCacheScorer
from epp.plugins.scorers.prefill_cost_scorer import PrefillCostScorer
from epp.plugins.scorers.prefix_cache_scorer import PrefixCacheScorer
from epp.plugins.scorers.queue_scorer import QueueScorer
from epp.plugins.scorers.running_requests_size_scorer import RunningRequestsSizeScorer
from epp.plugins.scorers.session_affinity_scorer import SessionAffinityScorer
from epp.plugins.scorers.token_load_scorer import TokenLoadScorer
from epp.plugins.scorers.topology_affinity_scorer import TopologyAffinityScorer

BUILTIN_PLUGINS: tuple[type[Plugin], ...] = (
    # filters
    ByLabelFilter,
    DecodeFilter,
    EncodeFilter,
    LabelSelectorFilter,
    PrefillFilter,
    SLOHeadroomTierFilter,
    PrefixCacheAffinityFilter,
    # scorers
    ActiveRequestScorer,
    ContextLengthAware,
    KVCacheUtilizationScorer,
    LatencyScorer,
    LoadAwareScorer,
    LoraAffinityScorer,
    NoHitLRUScorer,
    PrecisePrefixCacheScorer,
    PrefillCostScorer,
    PrefixCacheScorer,
    QueueScorer,
    RunningRequestsSizeScorer,
    SessionAffinityScorer,
    TokenLoadScorer,
    # pickers
    MaxScorePicker,
    RandomPicker,
    RoundRobinPicker,
    WeightedRandomPicker,
    # profile handlers
    SingleProfileHandler,
    # disaggregation (P/D, E/P/D): handlers, deciders, the deprecated headers handlers
    DisaggProfileHandler,
    PdProfileHandler,
    AlwaysDisaggPDDecider,
    PrefixBasedPDDecider,
    AlwaysDisaggMultimodalDecider,
    DisaggHeadersHandler,
    # data producers
    ApproxPrefixCacheProducer,
    BurstPrefixCacheProducer,
    InFlightLoadProducer,
    PrecisePrefixCacheProducer,
    PredictedLatencyProducer,
    TokenProducer,
    # admitters (after the producers, before scheduling)
    LatencySLOAdmitter,
    # admission: saturation detector (also a filter) and flow-control policies
    UtilizationDetector,
    ConcurrencyDetector,
    FCFSOrderingPolicy,
    GlobalStrictFairnessPolicy,
    RoundRobinFairnessPolicy,
    StaticUsageLimitPolicy,
    # data layer
    CoreMetricsExtractorPlugin,
    EndpointNotificationSource,
    MetricsDataSource,
    # cross-replica state (dataLayer.crossReplicaSyncerPluginRef)
    LocalSyncer,
    RedisCrossReplicaSyncer,
    WorkerStateSyncer,
    # discovery (dataLayer.discovery)
    FileDiscovery,
    # request parsers
    OpenAIParser,
    AnthropicParser,
    VLLMHTTPParser,
    SGLangHTTPParser,
    VertexAIParser,
    VLLMGRPCParser,
    PassthroughParser,
    # llm-d-router catalog: filters, scorers, data layer, GIE conformance
    UtilizationFilter,
    EndpointAttributeFilter,
    EndpointAttributeScorer,
    HeaderLabelAffinityScorer,
    TopologyExtractor,
    TopologyAffinityFilter,
    TopologyAffinityScorer,
    HeaderBasedTestingFilter,
    DestinationEndpointServedVerifier,
    EDFOrderingPolicy,
    SLODeadlineOrderingPolicy,
    ProgramAwareFairness,
    PriorityHoldbackPolicy,
    SoftReflectiveCeilingPolicy,
    AgentIdentity,
    ProbabilisticAdmitter,
    SessionAffinityFilter,
    SessionIDProducer,
    HeaderProfileHandler,
    DataParallelProfileHandler,
    RequestAttributeReporter,
    DCGMDataSource,
    DCGMExtractor,
    ModelsDataSource,
    ModelsDataExtractor,
    P2PSourceProducer,
    DisaggregatedSetRolloutScreener,
    SheddableEvictionFilter,
    PriorityThenTimeEvictionOrderPolicy,
    # multimodal encoder-cache affinity
    MMEmbeddingsCacheProducer,
    MMEmbeddingsCacheScorer,
    # a multi-cluster hub: clusters as endpoints, scored on their EPPs' pool averages
    MultiClusterFileDiscovery,
    MultiClusterMetricsDataSource,
    MultiClusterMetricsExtractor,
    MultiClusterKVCacheUtilizationScorer,
    MultiClusterQueueScorer,
    MultiClusterPrefixCacheScorer,
    MultiClusterSessionAffinityFilter,
    MultiClusterApproxPrefixCacheProducer,
)

# The router's parsers when `requestHandler.parsers` is empty (config/loader/defaults.go ensureParsers).
DEFAULT_PARSERS = ("openai-parser", "anthropic-parser", "vllmhttp-parser", "passthrough-parser")


def register_builtins(registry: PluginRegistry = REGISTRY) -> PluginRegistry:
    """Register every built-in type (idempotent), then third-party entry points."""
    for cls in BUILTIN_PLUGINS:
        registry.register(cls)
    registry.load_entry_points()
    return registry


def known_types() -> list[str]:
    """Every plugin type this EPP knows (built-ins, aliases and entry points)."""
    return register_builtins().known_types()


def default_parsers() -> ParserRegistry:
    """The router's default parser list, for servers built without a config (tests, benchmarks)."""
    by_type = {cls.type_name: cls for cls in BUILTIN_PLUGINS}
    parsers = [by_type[t]() for t in DEFAULT_PARSERS]
    return ParserRegistry([p for p in parsers if isinstance(p, RequestParser)])
