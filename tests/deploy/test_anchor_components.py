"""What the anchors' charts render besides the EPP, rendered by ours from the same values (or refused with a clear
message): llm-d-router's proxy (Envoy/agentgateway, sidecar or service mode) and GIE's sidecar, the tokenizer
sidecar, the latency predictor (pyepp's model is in process: the anchors' profile, no sidecars), GKE managed
Prometheus, parser choice, standalone mode without an InferencePool."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from epp.config import parse_config
from epp.datalayer.datastore import Datastore
from epp.server.options import parse_options
from epp.wiring import plugin_context, register_builtins
from epp.wiring.builder import build_pipeline
from tests.deploy import helm
from tests.deploy.test_anchor_values import (
    AGW,
    CASES,
    GIE_POOL,
    LABELS,
    NO_POOL,
    POOL_LABELS,
    ROUTER_GW,
    ROUTER_LABELS,
    ROUTER_SA,
    SERVICE,
    config_file,
    container_args,
    containers,
    deep_merge,
    epp_deployment,
    gie,
    gw,
    layered,
    rendered,
    sa,
    sets,
)
from tests.deploy.test_helm_chart import by_kind, one, render


def named(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in by_kind(docs, kind) if d["metadata"]["name"] == name]
    return found


def pod_volumes(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in epp_deployment(docs)["spec"]["template"]["spec"]["volumes"]}


def envoy_config(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return dict(yaml.safe_load(named(docs, "ConfigMap", "envoy")["data"]["envoy.yaml"]))


def ext_proc_cluster(cfg: dict[str, Any]) -> dict[str, Any]:
    (cluster,) = [c for c in cfg["static_resources"]["clusters"] if c["name"] == "ext_proc"]
    return dict(cluster)


def ext_proc_filter(cfg: dict[str, Any]) -> dict[str, Any]:
    for listener in cfg["static_resources"]["listeners"]:
        for chain in listener["filter_chains"]:
            for f in chain["filters"]:
                for hf in f["typed_config"].get("http_filters", []):
                    if hf["name"] == "envoy.filters.http.ext_proc":
                        return dict(hf["typed_config"])
    raise AssertionError("no ext_proc filter")


def build(docs: list[dict[str, Any]]) -> Any:
    name, text = config_file(docs)
    register_builtins()
    config = parse_config(text, source=name)
    build_pipeline(config, plugin_context(Datastore(), config.pool_name))
    return config


def test_envoy_proxy_sidecar_as_the_standalone_chart() -> None:
    docs = rendered("router-sa-basic")
    envoy = containers(docs)["envoy-proxy"]
    assert envoy["image"] == "docker.io/envoyproxy/envoy:distroless-v1.33.2"
    assert envoy["command"] == ["envoy"] and envoy["args"][-2:] == ["-c", "/etc/envoy/envoy.yaml"]
    assert {p["name"]: p["containerPort"] for p in envoy["ports"]} == {"http-8081": 8081, "metrics-19001": 19001}
    assert envoy["readinessProbe"]["httpGet"] == {"path": "/ready", "port": 19001, "scheme": "HTTP"}
    assert envoy["resources"]["requests"] == {"cpu": "4", "memory": "8Gi"}
    assert envoy["volumeMounts"] == [{"name": "config", "mountPath": "/etc/envoy", "readOnly": True}]
    assert pod_volumes(docs)["config"]["configMap"]["name"] == "envoy"
    # Envoy reaches the EPP on loopback over TLS (pyepp serves TLS by default, as the anchors' EPP); the standalone
    # values set failOpen: true.
    cfg = envoy_config(docs)
    cluster = ext_proc_cluster(cfg)
    assert cluster["type"] == "STATIC"
    address = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]
    assert address == {"address": "127.0.0.1", "port_value": 9002}
    assert cluster["transport_socket"]["name"] == "envoy.transport_sockets.tls"
    assert ext_proc_filter(cfg)["failure_mode_allow"] is True
    assert "--secure-serving=false" not in container_args(docs)
    # The listener port is on the EPP Service, where the anchors put it.
    ports = {p["name"]: p["port"] for p in named(docs, "Service", "qwen-pool-epp")["spec"]["ports"]}
    assert ports["http"] == 8081
    # Explicit router.proxy fields win over the preset (the perf config's args and resources).
    perf = containers(rendered("perf-random-passthrough"))["envoy-proxy"]
    assert perf["args"][:2] == ["--service-node", "envoy-sidecar"] and "--concurrency" in perf["args"]


def test_envoy_proxy_in_service_mode() -> None:
    docs = rendered("router-sa-proxy-service")
    assert "envoy-proxy" not in containers(docs)
    dep = named(docs, "Deployment", "qwen-pool-proxy")
    assert dep["spec"]["replicas"] == 3
    (envoy,) = dep["spec"]["template"]["spec"]["containers"]
    assert envoy["name"] == "envoy-proxy"
    selector = dep["spec"]["selector"]["matchLabels"]
    assert selector == {"llm-d-router-proxy": "qwen-pool-proxy"}
    assert selector.items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    svc = named(docs, "Service", "qwen-pool-proxy")
    assert svc["spec"]["selector"] == selector and svc["spec"]["ports"][0]["port"] == 8081
    cfg = envoy_config(docs)
    cluster = ext_proc_cluster(cfg)
    assert cluster["type"] == "STRICT_DNS"
    address = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]
    assert address["address"] == "qwen-pool-epp.llm.svc.cluster.local"
    assert ext_proc_filter(cfg)["failure_mode_allow"] is True  # service mode fails open by default
    closed = render(layered(*ROUTER_SA, extra=sa(SERVICE, ("router.proxy.failOpen", False))), namespace="llm")
    assert ext_proc_filter(envoy_config(closed))["failure_mode_allow"] is False


@pytest.mark.parametrize("mode", ["sidecar", "service"])
def test_agentgateway_proxy(mode: str) -> None:
    docs = rendered("router-sa-agentgateway" if mode == "sidecar" else "router-sa-agentgateway-service")
    assert "--secure-serving=false" in container_args(docs)  # agentgateway speaks plaintext gRPC to the EPP
    cfg = yaml.safe_load(named(docs, "ConfigMap", "agentgateway")["data"]["config.yaml"])
    (bind,) = cfg["binds"]
    assert bind["port"] == 8081
    (backend,) = bind["listeners"][0]["routes"][0]["backends"]
    assert backend["service"] == {"name": "llm/vllm-qwen", "port": 8000}
    host = "127.0.0.1:9002" if mode == "sidecar" else "qwen-pool-epp.llm.svc.cluster.local:9002"
    routing = backend["policies"]["inferenceRouting"]
    assert routing == {"endpointPicker": {"host": host}, "destinationMode": "passthrough"}
    assert cfg["services"][0]["hostname"] == "vllm-qwen" and cfg["services"][0]["ports"] == {8000: 8000}
    if mode == "sidecar":
        pod = epp_deployment(docs)["spec"]["template"]["spec"]
    else:
        pod = named(docs, "Deployment", "qwen-pool-proxy")["spec"]["template"]["spec"]
    (agw,) = [c for c in pod["containers"] if c["name"] == "agentgateway-proxy"]
    assert agw["ports"][0] == {"name": "http", "containerPort": 8081}
    assert agw["volumeMounts"] == [{"name": "agentgateway-config-template", "mountPath": "/config", "readOnly": True}]
    (vol,) = [v for v in pod["volumes"] if v["name"] == "agentgateway-config-template"]
    assert vol["configMap"]["name"] == "agentgateway"
    # A custom listener port (verify-helm.sh's case): the bind and the container's first port follow it.
    http = {"name": "http", "port": 9000, "protocol": "TCP", "targetPort": "http"}
    docs = render(layered(*ROUTER_SA, extra=sa(AGW, ("router.extraServicePorts", [http]))))
    assert yaml.safe_load(named(docs, "ConfigMap", "agentgateway")["data"]["config.yaml"])["binds"][0]["port"] == 9000
    assert containers(docs)["agentgateway-proxy"]["ports"][0] == {"name": "http", "containerPort": 9000}


BAD_PROXY = [
    (sets(("router.proxy.proxyType", "bogus")), "proxyType must be one of"),
    (sets(("router.proxy.mode", "daemonset")), "proxy.mode must be one of"),
    (sets(("router.proxy.failOpen", "notabool")), "failOpen must be a boolean"),
    (sets(("router.proxy.proxyType", "agentgateway"), ("router.proxy.agentgateway", {"service": {"name": "foo"}})),
     "router.proxy.agentgateway is no longer supported"),
    (sets(("router.proxy.proxyType", "agentgateway"), ("router.epp.flags", {"secure-serving": True})),
     "secure-serving must be false"),
    (sets(("router.proxy.proxyType", "agentgateway"),
          ("router.extraServicePorts", [{"name": "proxy", "port": 9000}])), "exactly one port named"),
    (sets(("router.proxy.proxyType", "agentgateway"),
          ("router.extraServicePorts", [{"name": "http", "port": 9000, "targetPort": 9001}])), "targetPort must be"),
    (sets(("router.proxy.mode", "service"), ("router.extraServicePorts", [])), "port named \"http\""),
]  # fmt: skip


@pytest.mark.parametrize(("extra", "message"), BAD_PROXY)
def test_bad_proxy_values_fail_as_the_anchor(extra: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmError, match=message):
        render(layered(*ROUTER_SA, extra=deep_merge(sa(), extra)))
    # agentgateway needs the standalone (pool-less) mode, as there.
    with pytest.raises(helm.HelmError, match="create=false is required"):
        render(layered(*ROUTER_SA, extra=deep_merge(ROUTER_LABELS, sets(("router.proxy.proxyType", "agentgateway")))))


def test_gie_sidecar_and_standalone_without_pool() -> None:
    docs = rendered("gie-standalone-no-pool")
    assert by_kind(docs, "InferencePool") == [] and by_kind(docs, "HealthCheckPolicy") == []
    opts = parse_options(container_args(docs)[1:])
    assert opts.endpoint_selector == "app=vllm-qwen"
    sidecar = containers(docs)["envoy-sidecar"]
    assert sidecar["image"] == "docker.io/envoyproxy/envoy:distroless-v1.33.2"
    assert sidecar["resources"]["requests"] == {"cpu": "100m", "memory": "512Mi"}
    assert pod_volumes(docs)["config"]["configMap"]["name"] == "envoy"
    cluster = ext_proc_cluster(envoy_config(docs))  # GIE's envoy.yaml is kept as written
    assert cluster["transport_socket"]["name"] == "envoy.transport_sockets.tls"
    # With the Inference APIs: the pool exists and the sidecar still runs beside the EPP.
    docs = rendered("gie-standalone")
    assert one(docs, "InferencePool")["spec"]["selector"]["matchLabels"] == LABELS
    assert "envoy-sidecar" in containers(docs)
    with pytest.raises(helm.HelmError, match=r"standalone mode .* needs the model servers' labels"):
        render(layered(*ROUTER_SA, extra=NO_POOL))
    with pytest.raises(helm.HelmError, match="inferenceObjectives can only be configured"):
        render(layered(*ROUTER_SA, extra=deep_merge(ROUTER_LABELS, deep_merge(NO_POOL, sets(
            ("router.inferenceObjectives", [{"name": "a", "priority": 1}]))))))  # fmt: skip


def test_tokenizer_sidecar() -> None:
    docs = rendered("perf-precise-prefix")
    tok = containers(docs)["vllm-render"]
    assert tok["image"] == "docker.io/vllm/vllm-openai-cpu:v0.21.0"
    assert tok["command"] == ["vllm", "launch", "render"]
    assert tok["args"] == ["Qwen/Qwen3-8B", "--port=8000", "--max-model-len=131072"]
    assert tok["ports"] == [{"name": "render-http", "containerPort": 8000}]
    assert {e["name"] for e in tok["env"]} >= {"HF_HOME", "HF_TOKEN"}
    assert tok["volumeMounts"][0] == {"name": "model-cache", "mountPath": "/root/.cache/huggingface"}
    assert pod_volumes(docs)["model-cache"] == {"name": "model-cache", "emptyDir": {}}
    # The EPP's token-producer talks to it on loopback, as configured in the anchor's plugins config.
    config = build(docs)
    producer = next(p for p in config.raw["plugins"] if p["type"] == "token-producer")
    assert producer["parameters"]["vllm"]["url"] == "http://localhost:8000"
    # Defaults of routerlib: `vllm launch render <modelName> --port=8000`.
    docs = render(layered(*ROUTER_GW, extra=deep_merge(ROUTER_LABELS, sets(
        ("router.tokenizer.enabled", True), ("router.tokenizer.modelName", "Qwen/Qwen3-8B")))))  # fmt: skip
    assert containers(docs)["vllm-render"]["args"] == ["Qwen/Qwen3-8B", "--port=8000"]
    with pytest.raises(helm.HelmError, match=r"tokenizer\.modelName is required"):
        render(layered(*ROUTER_GW, extra=deep_merge(ROUTER_LABELS, sets(("router.tokenizer.enabled", True)))))


LATENCY_PROFILE = ["predicted-latency-producer", "strict-affinity-filter", "slo-headroom-tier-filter",
                   "loose-affinity-filter", "latency-scorer", "weighted-random-picker"]  # fmt: skip


def test_latency_predictor_in_process() -> None:
    docs = rendered("gie-site-latency-predictor")
    # No training/prediction sidecars, no predictor env: pyepp's model runs in the EPP.
    assert list(containers(docs)) == ["epp"]
    assert not {"PREDICTION_SERVER_URL", "TRAINING_SERVER_URL"} & {e["name"] for e in containers(docs)["epp"]["env"]}
    assert not [c for c in by_kind(docs, "ConfigMap") if "latency-predictor" in c["metadata"]["name"]]
    config = build(docs)  # GIE's variant builds here
    (profile,) = config.raw["schedulingProfiles"]
    assert [p["pluginRef"] for p in profile["plugins"]] == LATENCY_PROFILE
    plugins = {p.get("name", p["type"]): p for p in config.raw["plugins"]}
    assert plugins["strict-affinity-filter"]["parameters"] == {"affinityThreshold": 0.99}
    assert {"latency-slo-admitter", "predicted-latency-producer"} <= set(plugins)
    # The router chart's variant reads the predictor's TTFT in the affinity filters.
    _, text = config_file(rendered("router-gw-latency-predictor"))
    router = {p.get("name", p["type"]): p for p in yaml.safe_load(text)["plugins"]}
    assert router["loose-affinity-filter"]["parameters"] == {
        "affinityThreshold": 0.8, "ttftSource": "latencyPredictor", "maxTTFTPenaltyMs": 5000}  # fmt: skip
    assert "predicted-latency-producer" not in yaml.safe_load(config_file(rendered("router-gw-gke"))[1])["plugins"]


def test_gke_managed_prometheus() -> None:
    docs = rendered("gie-site-latency-predictor")  # provider gke + prometheus enabled
    assert by_kind(docs, "ServiceMonitor") == []
    mon = one(docs, "PodMonitoring")
    assert mon["apiVersion"] == "monitoring.googleapis.com/v1"
    (ep,) = mon["spec"]["endpoints"]
    assert (ep["port"], ep["path"], ep["scheme"]) == ("metrics", "/metrics", "http")
    assert ep["authorization"]["credentials"]["secret"] == {"name": "qwen-pool-metrics-reader-secret", "key": "token"}
    labels = epp_deployment(docs)["spec"]["template"]["metadata"]["labels"]
    assert mon["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert "metrics" in {p["name"] for p in containers(docs)["epp"]["ports"]}
    secret = named(docs, "Secret", "qwen-pool-metrics-reader-secret")
    assert secret["metadata"]["annotations"]["kubernetes.io/service-account.name"] == "qwen-pool-metrics-reader-sa"
    binding = named(docs, "RoleBinding", "gmp-system:collector:llm-qwen-pool-metrics-reader-secret-read")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "collector", "namespace": "gmp-system"}]
    assert named(docs, "Role", "qwen-pool-metrics-reader-secret-read")["rules"][0]["resourceNames"] == [
        "qwen-pool-metrics-reader-secret"]  # fmt: skip
    # Autopilot: GMP's collector lives in gke-gmp-system (router layout: monitoring.provider.gmp.autopilot).
    values = layered(*ROUTER_GW, extra=deep_merge(ROUTER_LABELS, sets(
        ("router.monitoring.prometheus.enabled", True), ("router.monitoring.provider.name", "gmp"),
        ("router.monitoring.provider.gmp.autopilot", True))))  # fmt: skip
    docs = render(values, name="qwen-pool", namespace="llm")
    collectors = [b for b in by_kind(docs, "RoleBinding") if "collector" in b["metadata"]["name"]]
    assert [b["subjects"][0]["namespace"] for b in collectors] == ["gke-gmp-system"]
    # GIE's layout (its chart README): provider.gke.autopilot with provider.name gke, our own
    # monitoring.provider.gmp.autopilot default (false) notwithstanding.
    files, extra = CASES["gie-site-latency-predictor"]
    docs = render(layered(*files, extra=deep_merge(extra, sets(("provider.gke.autopilot", True)))), name="qwen-pool",
                  namespace="llm")  # fmt: skip
    binding = named(docs, "RoleBinding", "gke-gmp-system:collector:llm-qwen-pool-metrics-reader-secret-read")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "collector", "namespace": "gke-gmp-system"}]
    # Without auth, as the anchors: no PodMonitoring (and no ServiceMonitor on GKE).
    off = render(deep_merge(POOL_LABELS, sets(("provider.name", "gke"), ("monitoring.prometheus.enabled", True),
                                              ("monitoring.prometheus.auth.enabled", False))))  # fmt: skip
    assert by_kind(off, "PodMonitoring") == [] and by_kind(off, "ServiceMonitor") == []


@pytest.mark.parametrize(
    ("values", "parsers"),
    [
        (layered(*ROUTER_SA, extra=sa(("router.modelServers.type", "triton"))), ["passthrough-parser"]),
        (layered(*ROUTER_GW, extra=gw(("router.modelServers.protocol", "grpc"))), ["vllmgrpc-parser"]),
        (
            layered(*ROUTER_GW, extra=gw(("router.epp.parsers", ["openai-parser", "anthropic-parser"]))),
            ["openai-parser", "anthropic-parser"],
        ),
        (
            layered(
                *GIE_POOL,
                extra=gie(("inferencePool.parser", "openai-parser"), ("inferencePool.modelServerType", "sglang")),
            ),
            ["openai-parser"],
        ),
        (layered(*GIE_POOL, extra=POOL_LABELS), []),
    ],
)
def test_parser_choice(values: dict[str, Any], parsers: list[str]) -> None:
    docs = render(values, name="qwen-pool", namespace="llm")
    config = build(docs)
    assert config.request_parsers == parsers
    assert [p["type"] for p in config.raw["plugins"] if p["type"].endswith("-parser")] == parsers


def test_payload_agnostic_config_is_shipped() -> None:
    docs = render(layered(*ROUTER_GW, extra=deep_merge(ROUTER_LABELS, sets(
        ("router.epp.pluginsConfigFile", "payload-agnostic.yaml")))))  # fmt: skip
    name, _ = config_file(docs)
    assert name == "payload-agnostic.yaml"
    config = build(docs)
    assert config.request_parsers == ["passthrough-parser"]
    assert [p["pluginRef"] for p in config.raw["schedulingProfiles"][0]["plugins"]] == [
        "active-request-scorer", "session-affinity-scorer"]  # fmt: skip


def test_gke_preferred_backends() -> None:
    docs = rendered("router-gw-gke-preferred-backends")
    sts = epp_deployment(docs)
    assert sts["kind"] == "StatefulSet" and sts["spec"]["replicas"] == 2  # 1 preferred + 1 default
    assert sts["spec"]["serviceName"] == "qwen-pool-epp" and sts["spec"]["podManagementPolicy"] == "Parallel"
    assert "--ha-enable-leader-election" not in container_args(docs)  # every pod serves its own Service
    services = {s["metadata"]["name"]: s for s in by_kind(docs, "Service")}
    # both pods serve: they share their state through the Valkey the chart deploys
    assert services.pop("qwen-pool-epp-state")["spec"]["selector"]["app.kubernetes.io/component"] == "shared-state"
    assert "--cross-replica-address=redis://qwen-pool-epp-state.llm.svc:6379" in container_args(docs)
    assert {n: s["spec"]["selector"] for n, s in services.items()} == {
        "qwen-pool-epp": {"statefulset.kubernetes.io/pod-name": "qwen-pool-epp-0"},
        "qwen-pool-epp-backup": {"statefulset.kubernetes.io/pod-name": "qwen-pool-epp-1"},
    }
    assert services["qwen-pool-epp"]["metadata"]["annotations"]["cloud.google.com/neg"] == (
        '{"exposed_ports":{"9002":{}}}'
    )
    policies = {p["metadata"]["name"]: p["spec"] for p in by_kind(docs, "GCPBackendPolicy")}
    assert {n: (p["targetRef"]["name"], p["default"]["backendPreference"]) for n, p in policies.items()} == {
        "qwen-pool": ("qwen-pool-epp", "PREFERRED"),
        "qwen-pool-backup": ("qwen-pool-epp-backup", "DEFAULT"),
    }
    assert policies["qwen-pool"]["default"]["maxRatePerEndpoint"] == 100
    assert policies["qwen-pool"]["default"]["balancingMode"] == "RATE"
    checks = {h["metadata"]["name"]: h["spec"]["targetRef"] for h in by_kind(docs, "HealthCheckPolicy")}
    assert checks["qwen-pool-epp-backup"] == {"group": "", "kind": "Service", "name": "qwen-pool-epp-backup"}
    assert checks["qwen-pool"]["kind"] == "InferencePool"
    assert one(docs, "InferencePool")["spec"]["endpointPickerRef"]["name"] == "qwen-pool-epp"
    bad = gw(("provider.name", "gke"), ("provider.gke.preferredBackends.enabled", True),
             ("provider.gke.preferredBackends.defaultReplicas", -1))  # fmt: skip
    with pytest.raises(helm.HelmError, match="defaultReplicas must be at least 1"):
        render(layered(*ROUTER_GW, extra=bad))
    # Off (the default): one Deployment, one Service, the pool's backend policy.
    docs = rendered("router-gw-gke")
    assert epp_deployment(docs)["kind"] == "Deployment" and len(by_kind(docs, "Service")) == 1
    assert [p["metadata"]["name"] for p in by_kind(docs, "GCPBackendPolicy")] == ["qwen-pool"]


def test_tracing_values_reach_the_exporter() -> None:
    values = layered(*ROUTER_GW, extra=gw(("router.tracing.enabled", True), ("router.tracing.otelExporterEndpoint",
                     "http://otel.monitoring:4317"), ("router.tracing.sampling.samplerArg", "0.5")))  # fmt: skip
    docs = render(values, name="qwen-pool", namespace="llm")
    assert "--tracing=true" in container_args(docs)
    env = {e["name"]: e.get("value") for e in containers(docs)["epp"]["env"]}
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel.monitoring:4317"
    assert (env["OTEL_TRACES_SAMPLER"], env["OTEL_TRACES_SAMPLER_ARG"]) == ("parentbased_traceidratio", "0.5")
    assert env["OTEL_SERVICE_NAME"] == "llm-d-router/epp"
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" not in {e["name"] for e in containers(rendered("router-gw-gke"))["epp"]["env"]}


def test_renamed_proxy_config_and_extra_volumes() -> None:
    """llm-d's multi-cluster hub renames the Envoy ConfigMap (two routers in one namespace) and restates its volume;
    the preset's envoy.yaml follows the new name, and the EPP's own volumes are kept."""
    docs = rendered("guide-sa:llm-d__guides__multi-cluster-routing__router__hub.values.yaml")
    cm = named(docs, "ConfigMap", "mc-hub-envoy")
    assert "ext_proc" in cm["data"]["envoy.yaml"] and not [
        c for c in by_kind(docs, "ConfigMap") if c["metadata"]["name"] == "envoy"
    ]
    assert pod_volumes(docs)["config"]["configMap"]["name"] == "mc-hub-envoy"
    assert pod_volumes(docs)["clusters"]["configMap"]["name"] == "mc-hub-clusters"
    mounts = {m["name"]: m["mountPath"] for m in containers(docs)["epp"]["volumeMounts"]}
    assert mounts["clusters"] == "/etc/epp/clusters"
    assert "--allow-experimental-plugins=true" in container_args(docs)
