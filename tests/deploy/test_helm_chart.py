"""The Helm chart lints, renders, validates against Kubernetes' schemas (and the CRDs' own), and says what we mean."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from epp.config import parse_config
from epp.datalayer.datastore import Datastore
from epp.server.health import INFERENCE_EXTENSION, LIVENESS
from epp.wiring import plugin_context
from epp.wiring.builder import build_pipeline
from tests.deploy import helm

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "pyepp"
KUBE_VERSION = "1.31.0"
BASE = {"inferencePool": {"modelServers": {"matchLabels": {"app": "vllm-qwen"}}}}


def render(
    values: dict[str, Any] | None = None, name: str = "qwen-pool", namespace: str = "llm"
) -> list[dict[str, Any]]:
    """`helm template` with the real CLI."""
    return helm.template(CHART, values if values is not None else BASE, name=name, namespace=namespace)


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(docs, kind)
    assert len(found) == 1, f"{kind}: {len(found)}"
    return found[0]


def state(docs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The EPP's objects, and the shared-state Valkey's (rendered when replicas > 1)."""
    shared = [d for d in docs if d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "shared-state"]
    return [d for d in docs if d not in shared], shared


def crd_schemas() -> dict[str, dict[str, Any]]:
    crds = helm.crds(CHART)
    return {c["spec"]["names"]["kind"]: c["spec"]["versions"][0]["schema"]["openAPIV3Schema"] for c in crds}


def test_lint_is_clean() -> None:
    report = helm.lint(CHART, BASE, kube_version=KUBE_VERSION)
    assert "1 chart(s) linted, 0 chart(s) failed" in report
    assert "[WARNING]" not in report and "[ERROR]" not in report, report


def test_matchlabels_are_required() -> None:
    with pytest.raises(helm.HelmError, match="matchLabels is required"):
        render({})
    # (helm lint deliberately tolerates `fail`, so this is a render-time check, like GIE's _validations.tpl.)


def test_manifests_validate_against_kubernetes_schemas() -> None:
    values = {**BASE, "experimentalHttpRoute": {"enabled": True}, "monitoring": {"prometheus": {"enabled": True}}}
    docs = render(values)
    core = {"Deployment", "Service", "ServiceAccount", "Role", "RoleBinding", "ConfigMap"}
    assert core <= {d["kind"] for d in docs}
    for d in docs:
        if d["kind"] in core:
            kubernetes_validate.validate(d, KUBE_VERSION, strict=True)
    with pytest.raises(kubernetes_validate.ValidationError):
        bad = one(docs, "Deployment")
        bad["spec"]["replicas"] = "three"
        kubernetes_validate.validate(bad, KUBE_VERSION, strict=True)
    for crd in helm.crds(CHART):
        kubernetes_validate.validate(crd, KUBE_VERSION, strict=True)


def test_custom_resources_validate_against_the_crds() -> None:
    values = {**BASE, "inferenceObjectives": [{"name": "critical", "priority": 10}, {"name": "batch", "priority": -1}]}
    docs = render(values)
    schemas = crd_schemas()
    pool = one(docs, "InferencePool")
    jsonschema.validate(pool, schemas["InferencePool"])
    for obj in by_kind(docs, "InferenceObjective"):
        jsonschema.validate(obj, schemas["InferenceObjective"])
        assert obj["spec"]["poolRef"] == {
            "group": "inference.networking.k8s.io",
            "kind": "InferencePool",
            "name": "qwen-pool",
        }
    assert {o["metadata"]["name"]: o["spec"]["priority"] for o in by_kind(docs, "InferenceObjective")} == {
        "critical": 10,
        "batch": -1,
    }
    broken = dict(pool, spec={**pool["spec"], "targetPorts": []})
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, schemas["InferencePool"])
    assert pool["spec"]["selector"]["matchLabels"] == {"app": "vllm-qwen"}
    assert pool["spec"]["targetPorts"] == [{"number": 8000}]
    assert pool["spec"]["endpointPickerRef"] == {
        "group": "",
        "kind": "Service",
        "name": "qwen-pool-epp",
        "port": {"number": 9002},
        "failureMode": "FailOpen",
    }


def test_deployment_args_ports_probes_and_security() -> None:
    docs, shared = state(render({**BASE, "inferenceExtension": {"replicas": 2, "flags": {"log-level": "debug"}}}))
    dep = one(docs, "Deployment")
    assert dep["spec"]["replicas"] == 2
    # two replicas share their state through the Valkey the chart deploys, with nothing but its address
    valkey, valkey_svc = one(shared, "Deployment"), one(shared, "Service")
    for d in shared:
        kubernetes_validate.validate(d, KUBE_VERSION, strict=True)
    assert valkey_svc["spec"]["selector"] == valkey["spec"]["template"]["metadata"]["labels"]
    assert not valkey_svc["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    assert (
        f"--cross-replica-address=redis://{valkey_svc['metadata']['name']}.llm.svc:6379"
        in (dep["spec"]["template"]["spec"]["containers"][0]["args"])
    )
    own = render({**BASE, "inferenceExtension": {"replicas": 2, "crossReplica": {"address": "rediss://mine:6380"}}})
    assert (
        not state(own)[1]
        and "--cross-replica-address=rediss://mine:6380"
        in (one(own, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"])
    )
    single = render(BASE)
    assert not state(single)[1] and not any(
        "cross-replica" in a for a in one(single, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    )
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["args"][0] == "serve"
    for arg in (
        "--pool-name=qwen-pool",
        "--pool-namespace=llm",
        "--pool-group=inference.networking.k8s.io",
        "--config-file=/config/default-plugins.yaml",
        "--grpc-port=9002",
        "--grpc-health-port=9003",
        "--metrics-port=9090",
        "--log-level=debug",
    ):
        assert arg in c["args"]
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"grpc": 9002, "grpc-health": 9003, "metrics": 9090}
    assert c["readinessProbe"]["grpc"] == {"port": 9003, "service": "inference-extension"}
    assert c["livenessProbe"]["grpc"] == {"port": 9003, "service": "liveness"}
    assert {c["livenessProbe"]["grpc"]["service"], c["readinessProbe"]["grpc"]["service"]} <= {
        LIVENESS,
        INFERENCE_EXTENSION,
    }
    assert pod["securityContext"]["runAsNonRoot"] is True
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["capabilities"]["drop"] == ["ALL"]
    assert sc["allowPrivilegeEscalation"] is False
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes[mounts["/cache"]] and "emptyDir" in volumes[mounts["/tmp"]]
    assert volumes[mounts["/config"]]["configMap"]["name"] == "qwen-pool-epp"
    assert {e["name"] for e in c["env"]} >= {"NAMESPACE", "POD_NAME", "PYEPP_CACHE"}
    assert c["resources"]["requests"]["cpu"]
    assert pod["serviceAccountName"] == one(docs, "ServiceAccount")["metadata"]["name"]
    svc = one(docs, "Service")
    assert {p["name"]: p["port"] for p in svc["spec"]["ports"]} == {"grpc": 9002, "grpc-health": 9003, "metrics": 9090}
    assert svc["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()


def test_rbac_is_read_only_and_minimal() -> None:
    docs = render()
    role = one(docs, "Role")
    rules = {
        (g, r): sorted(rule["verbs"]) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]
    }
    assert rules == {
        ("", "pods"): ["get", "list", "watch"],
        ("inference.networking.k8s.io", "inferencepools"): ["get", "list", "watch"],
        ("inference.networking.x-k8s.io", "inferenceobjectives"): ["get", "list", "watch"],
    }
    binding = one(docs, "RoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"][0]["name"] == one(docs, "ServiceAccount")["metadata"]["name"]
    # Cluster-wide: only creating TokenReviews/SubjectAccessReviews (--metrics-endpoint-auth, on by default).
    (auth,) = by_kind(docs, "ClusterRole")
    assert [(r["apiGroups"], r["resources"], r["verbs"]) for r in auth["rules"]] == [
        (["authentication.k8s.io"], ["tokenreviews"], ["create"]),
        (["authorization.k8s.io"], ["subjectaccessreviews"], ["create"]),
    ]
    (c,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert "--metrics-endpoint-auth=false" not in c["args"]
    open_docs = render({**BASE, "monitoring": {"prometheus": {"auth": {"enabled": False}}}})
    assert by_kind(open_docs, "ClusterRole") == []
    (c,) = one(open_docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert "--metrics-endpoint-auth=false" in c["args"]


def test_config_weights_come_from_values() -> None:
    values = {
        **BASE,
        "inferenceExtension": {
            "scheduling": {
                "scorers": [
                    {"type": "queue-scorer", "weight": 1},
                    {"type": "prefix-cache-scorer", "name": "precise", "weight": 5, "parameters": {"blockSize": 64}},
                ],
                "picker": {"type": "max-score-picker"},
                "extraPlugins": [{"type": "decode-filter"}],
            }
        },
    }
    cm = one(render(values), "ConfigMap")
    cfg = parse_config(cm["data"]["default-plugins.yaml"]).raw
    assert cfg["kind"] == "EndpointPickerConfig"
    assert cfg["apiVersion"] == "inference.networking.x-k8s.io/v1alpha1"
    (profile,) = cfg["schedulingProfiles"]
    assert profile["plugins"] == [
        {"pluginRef": "queue-scorer", "weight": 1},
        {"pluginRef": "precise", "weight": 5},
        {"pluginRef": "max-score-picker"},
    ]
    plugins = {p.get("name", p["type"]): p for p in cfg["plugins"]}
    assert plugins["precise"] == {"type": "prefix-cache-scorer", "name": "precise", "parameters": {"blockSize": 64}}
    assert "decode-filter" in plugins
    default_cfg = parse_config(one(render(), "ConfigMap")["data"]["default-plugins.yaml"]).raw
    weights = {p["pluginRef"]: p.get("weight") for p in default_cfg["schedulingProfiles"][0]["plugins"]}
    assert weights == {"prefill-cost-scorer": 1, "max-score-picker": None}


def normalized(doc: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[str, float]]]:
    """An EndpointPickerConfig's plugins (name -> type, parameters) and its one profile (ref, weight)."""
    plugins = {p.get("name", p["type"]): (p["type"], p.get("parameters") or {}) for p in doc["plugins"]}
    (profile,) = doc["schedulingProfiles"]
    return plugins, [(r["pluginRef"], float(r.get("weight", 1))) for r in profile["plugins"]]


def test_default_values_render_pyepps_default_config() -> None:
    """The chart's default values render config/pyepp-default.yaml (issue 11: our default is the default)."""
    rendered = yaml.safe_load(one(render(), "ConfigMap")["data"]["default-plugins.yaml"])
    shipped = yaml.safe_load((ROOT / "config" / "pyepp-default.yaml").read_text())
    assert normalized(rendered) == normalized(shipped), (
        "config/pyepp-default.yaml and the chart's default values (inferenceExtension.scheduling) differ"
    )


@pytest.mark.parametrize(
    ("engine", "events"),
    [("vllm", {"topicFilter": "kv@"}), ("sglang", {"topicFilter": "kv@", "engineType": "sglang"}),
     ("triton-tensorrt-llm", {"topicFilter": "kv@", "enabled": False}),
     ("trtllm-serve", {"topicFilter": "kv@", "enabled": False})],
)  # fmt: skip
def test_default_config_follows_the_model_server_type(engine: str, events: dict[str, Any]) -> None:
    """SGLang publishes its own events; TensorRT-LLM servers none (every pod on the routing history)."""
    values = {"inferencePool": {**BASE["inferencePool"], "modelServerType": engine}}
    config = parse_config(one(render(values), "ConfigMap")["data"]["default-plugins.yaml"])
    (producer,) = [p for p in config.plugins if p.type == "precise-prefix-cache-producer"]
    assert producer.parameters["kvEventsConfig"] == events and producer.parameters["approximateFallback"] is True
    ctx = plugin_context(Datastore(), "qwen-pool")
    build_pipeline(config, ctx)
    svc = ctx.services.kv  # type: ignore[attr-defined]
    assert svc.settings.events_enabled is ("enabled" not in events)
    assert svc.settings.pool.engine_type == events.get("engineType", "vllm")


def test_optional_objects_toggle() -> None:
    docs = render()
    assert by_kind(docs, "HTTPRoute") == [] and by_kind(docs, "ServiceMonitor") == []
    values = {
        **BASE,
        "experimentalHttpRoute": {"enabled": True, "inferenceGatewayName": "gw", "baseModel": "Qwen/Qwen2.5"},
        "monitoring": {"prometheus": {"enabled": True}},
    }
    docs = render(values)
    route = one(docs, "HTTPRoute")
    assert route["spec"]["parentRefs"][0]["name"] == "gw"
    assert route["spec"]["rules"][0]["backendRefs"][0] == {
        "group": "inference.networking.k8s.io",
        "kind": "InferencePool",
        "name": "qwen-pool",
    }
    assert route["spec"]["rules"][0]["timeouts"]["request"] == "300s"
    mon = one(docs, "ServiceMonitor")
    assert mon["spec"]["endpoints"][0]["port"] == "metrics"
    assert mon["spec"]["selector"]["matchLabels"].items() <= one(docs, "Service")["metadata"]["labels"].items()


def test_grpc_model_servers_get_h2c() -> None:
    pool = one(render({"inferencePool": {**BASE["inferencePool"], "modelServerProtocol": "grpc"}}), "InferencePool")
    assert pool["spec"]["appProtocol"] == "kubernetes.io/h2c"
    with pytest.raises(helm.HelmError, match="modelServerProtocol"):
        render({"inferencePool": {**BASE["inferencePool"], "modelServerProtocol": "udp"}})


def test_sample_kv_events_values_render() -> None:
    values = yaml.safe_load((ROOT / "config" / "values-vllm-kv-events.yaml").read_text())
    docs, shared = state(render(values))
    assert one(shared, "Service")  # active-active: the replicas share their state
    for d in docs:
        if d["kind"] in {"Deployment", "ConfigMap", "Service"}:
            kubernetes_validate.validate(d, KUBE_VERSION, strict=True)
    jsonschema.validate(one(docs, "InferencePool"), crd_schemas()["InferencePool"])
    dep = one(docs, "Deployment")
    assert dep["spec"]["replicas"] >= 2  # active-active
    cfg = parse_config(one(docs, "ConfigMap")["data"]["default-plugins.yaml"]).raw
    # Same pipeline as the project's precise-prefix sample config, only with vLLM's event port 5557.
    sample = yaml.safe_load((ROOT / "config" / "llm-d-precise-prefix.yaml").read_text())
    assert sorted(p["type"] for p in cfg["plugins"]) == sorted(p["type"] for p in sample["plugins"])
    refs = [p["pluginRef"] for p in cfg["schedulingProfiles"][0]["plugins"]]
    assert refs == [p["pluginRef"] for p in sample["schedulingProfiles"][0]["plugins"]]
    assert cfg["dataLayer"] == sample["dataLayer"]
    producer = next(p for p in cfg["plugins"] if p["type"] == "precise-prefix-cache-producer")
    assert producer["parameters"]["kvEventsConfig"]["podDiscoveryConfig"]["socketPort"] == 5557


def test_default_config_tokenizes_through_the_tokenizer_sidecar() -> None:
    """llm-d-router's `router.tokenizer` sidecar (vLLM's render server on loopback): the default's precise producer
    tokenizes through it, for its model, instead of the bundled tokenizer."""
    image = {"registry": "docker.io", "repository": "vllm/vllm-openai", "tag": "v0.11.0"}
    tokenizer = {"enabled": True, "modelName": "meta-llama/Llama-3.1-8B", "port": 8100, "image": image}
    values = {**BASE, "router": {"tokenizer": tokenizer}}
    config = parse_config(one(render(values), "ConfigMap")["data"]["default-plugins.yaml"])
    (tok,) = [p for p in config.plugins if p.type == "token-producer"]
    assert tok.parameters == {"modelName": "meta-llama/Llama-3.1-8B", "vllm": {"url": "http://localhost:8100"}}
    pipeline = build_pipeline(config, plugin_context(Datastore(), "qwen-pool"))
    backend = pipeline.plugins["token-producer"].tokenizer.backend  # type: ignore[attr-defined]
    assert type(backend).__name__ == "RenderBackend" and backend.base == "http://localhost:8100"
    assert not [p for p in parse_config(one(render(), "ConfigMap")["data"]["default-plugins.yaml"]).plugins
                if p.type == "token-producer"]  # fmt: skip


def test_default_config_builds_with_the_plugin_registry() -> None:
    """The chart's default EndpointPickerConfig is one the EPP accepts (same path as `epp validate`)."""
    cm = one(render(), "ConfigMap")
    config = parse_config(cm["data"]["default-plugins.yaml"])
    pipeline = build_pipeline(config, plugin_context(Datastore(), "qwen-pool"))
    assert list(pipeline.scheduler.profiles) == ["default"]
    assert {"precise-prefix-cache-producer", "prefill-cost-scorer", "max-score-picker"} <= {
        p.get("type") for p in config.raw["plugins"]
    }


def test_routing_sidecar_on_decode_pods() -> None:
    values = {
        **BASE,
        "routingSidecar": {"enabled": True, "prefillMaxRetries": 2, "flags": {"enable-prefiller-sampling": "true"}},
        "decodeServers": {
            "enabled": True,
            "replicas": 2,
            "container": {"name": "vllm", "image": "vllm/vllm-openai:v0.11.0", "args": ["--port", "8200"]},
        },
    }
    docs = render(values)
    core = {"Deployment", "Service", "ServiceAccount", "Role", "RoleBinding", "ConfigMap"}
    for doc in docs:
        if doc["kind"] in core:
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
    decode = next(d for d in by_kind(docs, "Deployment") if d["metadata"]["name"] == "qwen-pool-decode")
    pod = decode["spec"]["template"]
    assert pod["metadata"]["labels"] == {"app": "vllm-qwen", "llm-d.ai/role": "decode"}
    vllm, sidecar = pod["spec"]["containers"]
    assert vllm["name"] == "vllm" and sidecar["command"] == ["epp-pd-sidecar"]
    assert sidecar["image"] == "ghcr.io/pyepp/pyepp:0.1.0"
    assert sidecar["args"] == [
        "--port=8000", "--model-server-port=8200", "--kv-connector=nixlv2", "--prefill-max-retries=2",
        "--prefill-timeout=60s", "--secure-proxy=false", "--enable-ssrf-protection=true",
        "--inference-pool=llm/qwen-pool", "--pool-group=inference.networking.k8s.io",
        "--enable-prefiller-sampling=true",
    ]  # fmt: skip
    from epp.sidecar.options import parse

    cfg, _ = parse(sidecar["args"])  # the rendered flags are the sidecar's own
    assert (cfg.inference_pool_name, cfg.prefill_max_retries, cfg.enable_prefiller_sampling) == ("qwen-pool", 2, True)
    role = next(d for d in by_kind(docs, "Role") if d["metadata"]["name"] == "qwen-pool-decode")
    assert {v for r in role["rules"] for v in r["verbs"]} == {"get", "list", "watch"}
    assert pod["spec"]["serviceAccountName"] == "qwen-pool-decode"
    # Without decodeServers: the container spec to add to decode pods deployed elsewhere.
    cms = by_kind(render({**BASE, "routingSidecar": {"enabled": True}}), "ConfigMap")
    container = yaml.safe_load(
        next(c for c in cms if c["metadata"]["name"] == "qwen-pool-routing-sidecar")["data"]["container.yaml"]
    )
    assert container["name"] == "routing-sidecar" and "--kv-connector=nixlv2" in container["args"]
    assert not [d for d in render() if "decode" in d["metadata"]["name"] or "routing" in d["metadata"]["name"]]


def test_deploy_doc_names_every_kind_the_default_values_render() -> None:
    """docs/deploy.md's "What gets created" table lists every kind `helm template` renders with the default values
    (it once omitted the ClusterRole/ClusterRoleBinding of --metrics-endpoint-auth)."""
    text = (ROOT / "docs" / "deploy.md").read_text()
    table = text[text.index("What gets created:") :].split("\n\n", 2)[1]
    named = {
        kind
        for line in table.splitlines()
        if line.startswith("| ")
        for kind in re.findall(r"[A-Z]\w+", line.split("|")[1])
    }
    assert {d["kind"] for d in render()} <= named
