"""The chart's Grafana dashboard (charts/pyepp/dashboards/pyepp.json): every panel's PromQL names only metrics the
EPP exports, with their own labels, and the chart renders it into a ConfigMap Grafana's sidecar picks up."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from epp.config import parse_config
from epp.server.metrics import request_metrics
from epp.wiring import register_builtins
from epp.wiring.runtime import build_runtime
from tests.deploy.test_helm_chart import BASE, CHART, one, render

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = CHART / "dashboards" / "pyepp.json"
# PromQL words that are not metric names.
PROMQL = {
    "sum", "max", "min", "avg", "count", "rate", "irate", "increase", "histogram_quantile", "by", "without", "on",
    "ignoring", "group_left", "group_right", "and", "or", "unless", "label_values", "le", "offset",
}  # fmt: skip
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",), "info": ("_info",)}


def exported() -> dict[str, set[str]]:
    """Every series name the EPP exports → its label names, from its registry after the EPP's modules and a runtime
    of the default config are set up (labelled metrics are listed before their first sample)."""
    register_builtins()  # imports every plugin module and its metrics
    request_metrics()
    text = (ROOT / "config" / "pyepp-default.yaml").read_text()
    build_runtime(parse_config(text + "\nendpoints: [{name: a, address: 10.0.0.1, port: 8000}]\n"))
    out: dict[str, set[str]] = {}
    for collector in list(REGISTRY._collector_to_names):  # private: a metric without samples has its labels only here
        labels = set(getattr(collector, "_labelnames", ()))
        kind = getattr(collector, "_type", "")
        for fam in collector.describe() if hasattr(collector, "describe") else ():
            for suffix in SUFFIXES.get(kind or fam.type, ("",)):
                out[fam.name + suffix] = labels | ({"le"} if suffix == "_bucket" else set())
    return out


def targets(dash: dict[str, Any]) -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in dash["panels"] if p["type"] != "row" for t in p["targets"]]


def metric_names(expr: str) -> tuple[set[str], set[str]]:
    """(metric names, label names) an expression uses."""
    labels: set[str] = set()
    for body in re.findall(r"\{([^}]*)\}", expr):
        labels |= set(re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", body))
    for body in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
        labels |= {x.strip() for x in body.split(",") if x.strip()}
    bare = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\b(?:by|without)\s*\([^)]*\)|\"[^\"]*\"", " ", expr)
    names = {
        m.group(0)
        for m in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", bare)
        if m.group(0) not in PROMQL and not bare[m.end() :].lstrip().startswith("(")
    }
    return names, labels


def test_every_panel_queries_metrics_the_epp_exports() -> None:
    dash = json.loads(DASHBOARD.read_text())
    series = exported()
    assert "inference_objective_request_total" in series and "kv_cache_events_blocks_total" in series
    panels = [p for p in dash["panels"] if p["type"] != "row"]
    assert len(panels) >= 20 and len({p["id"] for p in dash["panels"]}) == len(dash["panels"])
    for title, expr in targets(dash):
        names, labels = metric_names(expr)
        assert names, (title, expr)
        unknown = names - set(series)
        assert not unknown, f"{title!r}: {sorted(unknown)} not exported by the EPP"
        have = set().union(*(series[n] for n in names))
        assert labels <= have, f"{title!r}: labels {sorted(labels - have)} not on {sorted(names)}"
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            m = re.fullmatch(r"label_values\((\w+), (\w+)\)", var["definition"])
            assert m and m.group(1) in series and m.group(2) in series[m.group(1)], var


@pytest.mark.parametrize(
    ("expr", "found"),
    [
        ("sum(rate(inference_objective_request_total[5m]))", True),
        ("sum(rate(inference_objective_requests_total[5m]))", False),  # a typo is caught
        ('inference_pool_average_queue_size{pod_name="x"}', False),  # a label the metric does not have
    ],
)
def test_the_check_catches_what_is_not_exported(expr: str, found: bool) -> None:
    series = exported()
    names, labels = metric_names(expr)
    ok = names <= set(series) and labels <= set().union(*(series.get(n, set()) for n in names))
    assert ok is found


def test_the_chart_ships_the_dashboard() -> None:
    assert not [d for d in render() if d["metadata"]["name"].endswith("-dashboard")]
    docs = render({**BASE, "monitoring": {"grafana": {"dashboard": {"enabled": True}}}})
    cm = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "qwen-pool-epp-dashboard"]
    assert len(cm) == 1 and cm[0]["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm[0]["data"]["pyepp.json"]) == json.loads(DASHBOARD.read_text())
    assert one(docs, "Deployment")
