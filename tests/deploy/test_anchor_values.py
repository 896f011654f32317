"""The anchors' own chart values files (GIE v1.5's inferencepool chart, llm-d-router v0.10's charts, llm-d's guides;
sources and commits in anchor_values/MANIFEST.tsv) render through our chart unchanged, every manifest validates, and
the values take effect: pool selector, config file, flags, failure mode, ports, provider objects."""

from __future__ import annotations

import copy
import csv
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from epp.config import ConfigError, parse_config
from epp.datalayer.datastore import Datastore
from epp.server.goflags import FlagError
from epp.server.options import parse_options
from epp.wiring import plugin_context, register_builtins
from epp.wiring.builder import build_pipeline
from tests.deploy import helm
from tests.deploy.test_helm_chart import CHART, KUBE_VERSION, by_kind, crd_schemas, one, render

VALUES = Path(__file__).parent / "anchor_values"
CORE = {"Deployment", "StatefulSet", "Service", "ServiceAccount", "Role", "RoleBinding", "ConfigMap", "ClusterRole",
        "ClusterRoleBinding", "Secret"}  # fmt: skip
# Provider custom resources (GKE Gateway, GKE managed Prometheus, Istio): their CRDs are not installed here.
PROVIDER_KINDS = {"HealthCheckPolicy", "GCPBackendPolicy", "PodMonitoring", "DestinationRule", "HTTPRoute",
                  "ServiceMonitor"}  # fmt: skip
LABELS = {"app": "vllm-qwen"}
POOL_LABELS = {"inferencePool": {"modelServers": {"matchLabels": LABELS}}}
ROUTER_LABELS = {"router": {"modelServers": {"matchLabels": LABELS}}}


def manifest() -> dict[str, dict[str, str]]:
    with open(VALUES / "MANIFEST.tsv") as f:
        return {row["file"]: row for row in csv.DictReader(f, delimiter="\t")}


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Helm's `-f a -f b`: maps merge recursively, anything else is replaced."""
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def layered(*files: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """`helm -f a -f b --set ...`; `file@key` nests a library chart's values under its alias (as a parent chart's
    dependency alias does: GIE's epplib under inferenceExtension)."""
    values: dict[str, Any] = {}
    for entry in files:
        name, _, nest = entry.partition("@")
        loaded = yaml.safe_load((VALUES / name).read_text()) or {}
        values = deep_merge(values, {nest: loaded} if nest else loaded)
    return deep_merge(values, extra or {})


# The anchors' charts and their defaults: llm-d-router's gateway/standalone charts take routerlib's values under
# `router:` (their dependency alias); GIE's inferencepool/standalone charts take epplib's under `inferenceExtension:`.
ROUTERLIB = "llm-d-router__routerlib__values.router.yaml"
ROUTER_GW = [ROUTERLIB, "llm-d-router__gateway__values.yaml"]
ROUTER_SA = [ROUTERLIB, "llm-d-router__standalone__values.yaml"]
GIE_POOL = ["gie__epplib__values.yaml@inferenceExtension", "gie__inferencepool__values.yaml"]
GIE_SA = ["gie__epplib__values.yaml@inferenceExtension", "gie__standalone__values.yaml"]
NO_POOL = {"router": {"inferencePool": {"create": False}}}


def sets(*pairs: tuple[str, Any]) -> dict[str, Any]:
    """`--set a.b.c=v` pairs as a values tree."""
    out: dict[str, Any] = {}
    for path, value in pairs:
        node = out
        *parents, leaf = path.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return out


def gie(*pairs: tuple[str, Any]) -> dict[str, Any]:
    return deep_merge(POOL_LABELS, sets(*pairs))


def gw(*pairs: tuple[str, Any]) -> dict[str, Any]:
    return deep_merge(ROUTER_LABELS, sets(*pairs))


def sa(*pairs: tuple[str, Any]) -> dict[str, Any]:
    """llm-d-router-standalone without an InferencePool (router.inferencePool.create=false)."""
    return deep_merge(deep_merge(ROUTER_LABELS, NO_POOL), sets(*pairs))


AGW = ("router.proxy.proxyType", "agentgateway")
SERVICE = ("router.proxy.mode", "service")
LATENCY = "latencyPredictor.enabled"
GIE_STANDALONE_NO_POOL = sets(
    ("inferenceExtension.endpointsServer.endpointSelector", "app=vllm-qwen"),
    ("inferenceExtension.endpointsServer.createInferencePool", False),
    ("provider.name", "gke"),
)

# (values files, layered in order; what `helm install --set` adds in the anchors' docs and CI:
# llm-d-router's hack/verify-helm.sh test cases, GIE's chart README and site guides)
CASES: dict[str, tuple[list[str], dict[str, Any]]] = {
    "gie-inferencepool": (["gie__inferencepool__values.yaml"], POOL_LABELS),
    "gie-inferencepool-with-lib": (GIE_POOL, POOL_LABELS),
    # GIE site-src/_includes/epp.md (GKE and Istio tabs)
    "gie-site-gke": (GIE_POOL, gie(("provider.name", "gke"), ("experimentalHttpRoute.enabled", True))),
    "gie-site-istio": (GIE_POOL, gie(("provider.name", "istio"), ("experimentalHttpRoute.enabled", True))),
    # GIE site-src/guides/latency-based-predictor.md
    "gie-site-latency-predictor": (
        GIE_POOL,
        gie(
            ("inferenceExtension.monitoring.prometheus.enabled", True),
            (f"inferenceExtension.{LATENCY}", True),
            ("provider.name", "gke"),
        ),
    ),
    # GIE site-src/guides/standalone.md, with and without the Inference APIs
    "gie-standalone": (GIE_SA, gie(("provider.name", "gke"))),
    "gie-standalone-no-pool": (GIE_SA, GIE_STANDALONE_NO_POOL),
    "llm-d-router-gateway": (["llm-d-router__gateway__values.yaml"], ROUTER_LABELS),
    "llm-d-router-routerlib": (ROUTER_GW, ROUTER_LABELS),
    # llm-d-router hack/verify-helm.sh: the llm-d-router-gateway cases
    "router-gw-gke": (ROUTER_GW, gw(("provider.name", "gke"))),
    "router-gw-multiple-replicas": (ROUTER_GW, gw(("router.replicas", 3))),
    "router-gw-latency-predictor": (ROUTER_GW, gw((f"router.{LATENCY}", True))),
    # the gateway chart's documented provider.gke.preferredBackends (values.yaml), switched on
    "router-gw-gke-preferred-backends": (
        ROUTER_GW,
        gw(("provider.name", "gke"), ("provider.gke.preferredBackends.enabled", True), ("router.epp.replicas", 3)),
    ),
    # llm-d-router hack/verify-helm.sh: the llm-d-router-standalone cases
    "router-sa-basic": (ROUTER_SA, sa()),
    "router-sa-gke": (ROUTER_SA, sa(("provider.name", "gke"))),
    "router-sa-latency-predictor": (ROUTER_SA, sa((f"router.{LATENCY}", True))),
    "router-sa-with-pool": (ROUTER_SA, gw(("router.inferencePool.create", True))),
    "router-sa-agentgateway": (ROUTER_SA, sa(AGW)),
    "router-sa-proxy-service": (ROUTER_SA, sa(SERVICE, ("router.proxy.replicas", 3))),
    "router-sa-agentgateway-service": (ROUTER_SA, sa(AGW, SERVICE)),
    "router-sa-triton": (ROUTER_SA, sa(("router.modelServers.type", "triton"))),
    # test/perf/config/router-configs (installed over the standalone chart by test/perf/run_nightly_perf.py)
    "perf-optimized-baseline": ([*ROUTER_SA, "llm-d-router__perf__optimized-baseline.yaml"], ROUTER_LABELS),
    "perf-random": ([*ROUTER_SA, "llm-d-router__perf__random-only-default-parsers.yaml"], ROUTER_LABELS),
    "perf-random-passthrough": ([*ROUTER_SA, "llm-d-router__perf__random-passthrough-parser.yaml"], ROUTER_LABELS),
    "perf-precise-prefix": ([*ROUTER_SA, "llm-d-router__perf__precise-prefix.yaml"], ROUTER_LABELS),
    "guide-optimized-baseline": (
        ["llm-d__guides__recipes__router__base.values.yaml", "llm-d__guides__optimized-baseline__router.values.yaml"],
        {},
    ),
    "guide-flow-control": (
        ["llm-d__guides__recipes__router__base.values.yaml", "llm-d__guides__flow-control__router.values.yaml"],
        {},
    ),
    "guide-inference-scheduling": (
        [
            "llm-d__guides__recipes__scheduler__base.values.yaml",
            "llm-d__guides__inference-scheduling__scheduler.values.yaml",
        ],
        {},
    ),
}


def has_labels(values: dict[str, Any]) -> bool:
    router = values.get("router") or {}
    return bool(((router.get("modelServers") or {}).get("matchLabels")) or
                ((values.get("inferencePool") or {}).get("modelServers") or {}).get("matchLabels"))  # fmt: skip


def guide_cases() -> dict[str, tuple[list[str], dict[str, Any]]]:
    """llm-d's guides install their router values over recipes/router/base.values.yaml, with the standalone chart or
    the gateway chart (`--set provider.name=... --set httpRoute.create=true`); the older scheduler/ and manifests/
    values go to GIE's inferencepool chart (scheduler/ over recipes/scheduler/base.values.yaml)."""
    base = "llm-d__guides__recipes__router__base.values.yaml"
    gateway = sets(("provider.name", "gke"), ("httpRoute.create", True),
                   ("httpRoute.inferenceGatewayName", "llm-d-inference-gateway"))  # fmt: skip
    out: dict[str, tuple[list[str], dict[str, Any]]] = {}
    for path in sorted(VALUES.glob("llm-d*__guides__*.yaml")):
        name = path.name
        if name in GUIDE_LAYERS:
            continue
        top = yaml.safe_load(path.read_text()) or {}
        if "router" in top or "httpRoute" in top:
            files_sa, files_gw = [*ROUTER_SA, base, name], [*ROUTER_GW, base, name]
            if "__features__" in name or "__leaf." in name:  # features (and the multi-cluster leaf) layer over a guide
                guide = "llm-d__guides__optimized-baseline__router.values.yaml"
                files_sa, files_gw = [*ROUTER_SA, base, guide, name], [*ROUTER_GW, base, guide, name]
            for kind, files, extra in (("sa", files_sa, {}), ("gw", files_gw, gateway)):
                labels = {} if has_labels(layered(*files)) else ROUTER_LABELS
                out[f"guide-{kind}:{name}"] = (files, deep_merge(labels, extra))
        else:
            files = [*GIE_POOL, name]
            if "__scheduler__" in name:
                files = [*GIE_POOL, "llm-d__guides__recipes__scheduler__base.values.yaml", name]
            if "__scheduler__features__" in name:  # over its guide (precise-prefix-cache-aware)
                files.insert(-1, name.split("__features__")[0] + ".values.yaml")
            out[f"guide-gie:{name}"] = (files, {} if has_labels(layered(*files)) else POOL_LABELS)
    return out


AGW_GUIDE = [
    *ROUTER_SA,
    "llm-d__guides__recipes__router__base.values.yaml",
    "llm-d__guides__optimized-baseline__router.values.yaml",
    "llm-d__guides__optimized-baseline__router__optimized-baseline-agentgateway.values.yaml",
    "llm-d__guides__recipes__router__features__agentgateway-proxy.values.yaml",
]
# Files that only layer under others (covered by the cases that use them).
GUIDE_LAYERS = {
    "llm-d__guides__recipes__router__base.values.yaml",
    "llm-d__guides__recipes__scheduler__base.values.yaml",
    *AGW_GUIDE[-2:],
}
CASES.update(guide_cases())
# The optimized-baseline guide's agentgateway variant (its README: standalone chart, proxyType=agentgateway).
CASES["guide-sa:optimized-baseline-agentgateway"] = (AGW_GUIDE, sets(AGW, ("router.inferencePool.create", False)))

# Cases the chart refuses to render, with the reason (docs/compatibility.md).
RENDER_REFUSED = {
    # llm-d's older recipe pins the pre-GA InferencePool API; both anchors' charts render only the GA v1 pool.
    "guide-gie:llm-d__guides__recipes__inferencepool__inferencepool-pd.values.yaml": "v1alpha2 is not rendered",
}

# Cases whose rendered args `epp serve` refuses, as the anchor's EPP does, with the reason (docs/compatibility.md).
ARGS_REFUSED = {
    # GIE v1.5's EPP took the per-metric flags; llm-d-router v0.10 (and pyepp) reject them for engineConfigs.
    "guide-gie:llm-d__guides__wide-ep-lws__manifests__inferencepool.values.yaml": "kv-cache-usage-percentage-metric",
}


def rendered(case: str) -> list[dict[str, Any]]:
    files, extra = CASES[case]
    return render(layered(*files, extra=extra), name="qwen-pool", namespace="llm")


def epp_deployment(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The EPP's workload: a Deployment, or a StatefulSet with GKE preferred backends."""
    (dep,) = [d for d in docs if d["kind"] in ("Deployment", "StatefulSet") and d["metadata"]["name"].endswith("-epp")]
    return dep


def containers(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The EPP pod's containers by name."""
    return {c["name"]: c for c in epp_deployment(docs)["spec"]["template"]["spec"]["containers"]}


def container_args(docs: list[dict[str, Any]]) -> list[str]:
    return list(containers(docs)["epp"]["args"])


def config_file(docs: list[dict[str, Any]]) -> tuple[str, str]:
    args = container_args(docs)
    path = next(a.split("=", 1)[1] for a in args if a.startswith("--config-file="))
    name = path.removeprefix("/config/")
    (cm,) = [c for c in by_kind(docs, "ConfigMap") if c["metadata"]["name"].endswith("-epp")]
    return name, cm["data"][name]


def corpus_exception(files: list[str]) -> str | None:
    """The reason tests/corpus/exceptions.tsv gives for the config these values files carry, if any."""
    corpus = Path(__file__).parents[1] / "corpus"
    with open(corpus / "manifest.tsv") as f:
        by_source = {(r["repo"], r["path"]): r["file"] for r in csv.DictReader(f, delimiter="\t")}
    with open(corpus / "exceptions.tsv") as f:
        reasons = {r["file"]: r["reason"] for r in csv.DictReader(f, delimiter="\t")}
    rows = manifest()
    for name in files:
        row = rows[name.partition("@")[0]]
        corpus_file = by_source.get((row["repo"], row["path"]))
        if corpus_file in reasons:
            return reasons[corpus_file]
    return None


ROUTER_LATENCY_DEFAULT = (
    "llm-d-router__config__charts__routerlib__templates___config__default-plugins_latency-predictor.yaml"
)


def corpus_reason(corpus_file: str) -> str | None:
    with open(Path(__file__).parents[1] / "corpus" / "exceptions.tsv") as f:
        return {r["file"]: r["reason"] for r in csv.DictReader(f, delimiter="\t")}.get(corpus_file)


def test_every_values_file_is_used_and_sourced() -> None:
    rows = manifest()
    used = {f.partition("@")[0] for files, _ in CASES.values() for f in files}
    on_disk = {p.name for p in VALUES.glob("*.yaml")}
    assert used == on_disk == set(rows)
    for row in rows.values():
        assert len(row["commit"]) == 40 and row["repo"] and row["path"]


@pytest.mark.parametrize("case", sorted(CASES))
def test_anchor_values_render_and_validate(case: str) -> None:
    if case in RENDER_REFUSED:
        with pytest.raises(helm.HelmError, match=RENDER_REFUSED[case]):
            rendered(case)
        return
    docs = rendered(case)
    schemas = crd_schemas()
    kinds = {d["kind"] for d in docs}
    assert {"Service", "ConfigMap"} <= kinds and ({"Deployment", "StatefulSet"} & kinds)
    for d in docs:
        assert d.get("apiVersion") and d.get("metadata", {}).get("name"), d
        if d["kind"] in CORE:
            kubernetes_validate.validate(d, KUBE_VERSION, strict=True)
        elif d["kind"] in schemas:
            jsonschema.validate(d, schemas[d["kind"]])
        else:
            assert d["kind"] in PROVIDER_KINDS, d["kind"]
    # The container args parse with `epp serve`'s flags (the same parser the binary uses).
    args = container_args(docs)
    assert args[0] == "serve"
    if case in ARGS_REFUSED:
        with pytest.raises(FlagError, match=ARGS_REFUSED[case]):
            parse_options(args[1:])
        return
    opts = parse_options(args[1:])
    if by_kind(docs, "InferencePool"):
        assert opts.pool_name == "qwen-pool" and opts.pool_namespace == "llm"
        # The pool selects the model servers the values name.
        assert one(docs, "InferencePool")["spec"]["selector"]["matchLabels"]
    else:  # standalone: the EPP selects the pods itself
        assert opts.pool_name in ("", None) and opts.endpoint_selector and opts.endpoint_target_ports
    tracing = (layered(*CASES[case][0], extra=CASES[case][1]).get("router") or {}).get("tracing") or {}
    assert opts.zap_encoder == "json" and opts.tracing is bool(tracing.get("enabled"))
    # The config file the args point at is in the ConfigMap and builds here (unless the corpus test lists that very
    # config as an exception, with its reason).
    name, text = config_file(docs)
    register_builtins()
    expected = corpus_exception(CASES[case][0])
    if name == "default-plugins.yaml" and "ttftSource: latencyPredictor" in text:
        expected = corpus_reason(ROUTER_LATENCY_DEFAULT)
    if expected is None:
        config = parse_config(text, source=name)
        build_pipeline(config, plugin_context(Datastore(), config.pool_name))
    else:  # listed as pending there: it may load by now, and if not, the error is a clear ConfigError
        try:
            config = parse_config(text, source=name)
            build_pipeline(config, plugin_context(Datastore(), config.pool_name))
        except ConfigError as e:
            assert str(e).startswith(name + ":"), e
    # The image is pyepp's (not the anchors' Go EPP).
    image = containers(docs)["epp"]["image"]
    assert "pyepp" in image and "endpoint-picker" not in image and "inference-scheduler" not in image


def test_router_layout_takes_effect() -> None:
    docs = rendered("guide-flow-control")
    assert one(docs, "InferencePool")["spec"]["selector"]["matchLabels"] == {"llm-d.ai/guide": "flow-control"}
    assert one(docs, "InferencePool")["spec"]["endpointPickerRef"]["failureMode"] == "FailOpen"
    name, text = config_file(docs)
    assert name == "custom-plugins.yaml" and "flowControl" in text
    args = container_args(docs)
    assert "--v=2" in args and "--zap-encoder=json" in args and "--ha-enable-leader-election" not in args
    ports = {p["name"]: p["port"] for p in one(docs, "Service")["spec"]["ports"]}
    assert ports["http"] == 80
    res = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert res["requests"] == {"cpu": "4", "memory": "8Gi"}
    # The older llm-d chart layout: config files under inferencePool, image hub/name of the Go EPP.
    docs = rendered("guide-inference-scheduling")
    name, text = config_file(docs)
    assert name == "inference-scheduling-plugins.yaml" and "prefix-cache-scorer" in text
    assert one(docs, "InferencePool")["spec"]["selector"]["matchLabels"] == {"llm-d.ai/guide": "inference-scheduling"}


def test_replicas_and_auth_follow_the_anchors() -> None:
    base = {"router": {"modelServers": {"matchLabels": LABELS}, "epp": {"replicas": 3},
                       "monitoring": {"prometheus": {"enabled": True, "auth": {"enabled": False}}}}}  # fmt: skip
    docs = render(layered("llm-d-router__gateway__values.yaml", extra=base))
    args = container_args(docs)
    assert "--ha-enable-leader-election" in args and "--metrics-endpoint-auth=false" in args
    role = one(docs, "Role")
    assert any("leases" in r["resources"] for r in role["rules"])
    (dep,) = [d for d in by_kind(docs, "Deployment") if d["metadata"]["name"] == "qwen-pool-epp"]
    assert dep["spec"]["replicas"] == 3 and any(a.startswith("--cross-replica-address=redis://") for a in args)
    docs = render(
        deep_merge(
            layered("llm-d-router__gateway__values.yaml", extra=base),
            {"inferenceExtension": {"haMode": "active-active"}},
        )
    )
    assert "--ha-enable-leader-election" not in container_args(docs)
    # Auth on (the default): the ServiceMonitor sends a metrics-reader token, which may get /metrics.
    docs = render(
        {"inferencePool": {"modelServers": {"matchLabels": LABELS}}, "monitoring": {"prometheus": {"enabled": True}}}
    )
    (sm,) = by_kind(docs, "ServiceMonitor")
    assert sm["spec"]["endpoints"][0]["authorization"]["credentials"]["name"] == "pyepp-metrics-reader-secret"
    readers = [c for c in by_kind(docs, "ClusterRole") if c["rules"][0].get("nonResourceURLs") == ["/metrics"]]
    assert len(readers) == 1
    secret = one(docs, "Secret")
    assert secret["type"] == "kubernetes.io/service-account-token"


def test_flags_map_renders_as_go_flags() -> None:
    flags = {"v": 4, "enable-pprof": True, "drain-timeout": "45s", "secure-serving": False}
    values = {**POOL_LABELS, "inferenceExtension": {"flags": flags}}
    opts = parse_options(container_args(render(values))[1:])
    assert (opts.v, opts.enable_pprof, opts.drain_timeout, opts.secure_serving) == (4, True, 45.0, False)


@pytest.mark.parametrize(
    ("engine", "path", "family"),
    [
        ("sglang", "/metrics", "sglang:num_queue_reqs"),
        ("trtllm-serve", "/prometheus/metrics", "trtllm_num_requests_waiting"),
    ],
)
def test_model_server_type_selects_the_engine(engine: str, path: str, family: str) -> None:
    from epp.wiring import build_runtime

    docs = render({"inferencePool": {"modelServers": {"matchLabels": LABELS}, "modelServerType": engine}})
    _, text = config_file(docs)
    runtime = build_runtime(parse_config(text, source="default-plugins.yaml"))
    assert runtime.scraper is not None and runtime.scraper.path == path
    engines = runtime.scraper.extractor.engines
    assert runtime.scraper.extractor.default_engine == engine and engine in engines
    assert family in str(engines[engine])


def test_provider_objects() -> None:
    docs = render({"inferencePool": {"modelServers": {"matchLabels": LABELS}}, "provider": {"name": "gke"},
                   "experimentalHttpRoute": {"enabled": True}})  # fmt: skip
    hc = one(docs, "HealthCheckPolicy")
    assert hc["apiVersion"] == "networking.gke.io/v1"
    assert hc["spec"]["targetRef"] == {
        "group": "inference.networking.k8s.io",
        "kind": "InferencePool",
        "name": "qwen-pool",
    }
    assert hc["spec"]["default"]["config"] == {
        "type": "HTTP",
        "httpHealthCheck": {"requestPath": "/health", "port": 8000},
    }
    bp = one(docs, "GCPBackendPolicy")
    assert bp["spec"]["default"]["timeoutSec"] == 300 and bp["spec"]["targetRef"]["name"] == "qwen-pool"
    assert "timeouts" not in one(docs, "HTTPRoute")["spec"]["rules"][0]  # GKE: the backend policy's timeout
    pool = {"http": {"maxRequestsPerConnection": 256000}}
    istio = {"name": "istio", "istio": {"destinationRule": {"trafficPolicy": {"connectionPool": pool}}}}
    docs = render({**POOL_LABELS, "provider": istio})
    dr = one(docs, "DestinationRule")
    assert dr["spec"]["host"] == "qwen-pool-epp.llm.svc.cluster.local"
    assert dr["spec"]["trafficPolicy"]["tls"] == {"mode": "SIMPLE", "insecureSkipVerify": True}
    assert dr["spec"]["trafficPolicy"]["connectionPool"] == {"http": {"maxRequestsPerConnection": 256000}}
    assert by_kind(render(POOL_LABELS), "DestinationRule") == []


def test_header_matches_in_both_forms() -> None:
    base = {"inferencePool": {"modelServers": {"matchLabels": LABELS}}}
    as_map = render({**base, "httpRoute": {"create": True, "headerMatches": {"x-route": "qwen"}}})
    as_list = render(
        {
            **base,
            "experimentalHttpRoute": {
                "enabled": True,
                "headerMatches": [{"type": "Exact", "name": "x-route", "value": "qwen"}],
            },
        }
    )
    for docs in (as_map, as_list):
        (match,) = one(docs, "HTTPRoute")["spec"]["rules"][0]["matches"]
        assert match["headers"] == [{"type": "Exact", "name": "x-route", "value": "qwen"}]


@pytest.mark.parametrize("case", ["router-sa-latency-predictor", "router-gw-latency-predictor"])
def test_the_latency_predictors_sidecar_values_are_named_at_render_time(case: str) -> None:
    """The anchors' latencyPredictor.{trainingServer,predictionServers,eppEnv} (61 keys in routerlib's values) set
    up XGBoost sidecars; ours is in process, and `helm install` says so, naming the groups the values set."""
    files, extra = CASES[case]
    values = layered(*files, extra=extra)
    text = helm.notes(CHART, values, name="qwen-pool", namespace="llm")
    assert "predicted-latency-producer's in-process model" in text
    assert "trainingServer.{config,image,livenessProbe,port,readinessProbe,resources,volumeSize}" in text, text
    assert "predictionServers.{config,count,image," in text and "eppEnv.{LATENCY_COALESCE_WINDOW_MS," in text
    values["router"]["latencyPredictor"]["enabled"] = False
    assert "Latency predictor" not in helm.notes(CHART, values, name="qwen-pool", namespace="llm")
