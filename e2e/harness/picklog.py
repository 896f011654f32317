"""Pick logs: every pick an EPP made on a replay, in one format whatever the EPP, and two EPPs' picks compared.

Where the picks come from, for any EPP behind the harness's Envoy:

- **Envoy's access log** (`EnvoyOptions.pick_log`): one JSON line per request with the replay index the load
  generator sent (`x-replay-index`), the request id Envoy gave the EPP (`x-request-id`), the pod that served it and
  the `envoy.lb` metadata the EPP answered with: `x-gateway-destination-endpoint` (the pick) and, with
  `--emit-endpoint-scores` (pyepp and llm-d-router both have the flag), `x-gateway-destination-endpoint-scores` (the
  weighted total per candidate left by the filters). That is enough for agreement, ties and the candidate sets.
- **Per-scorer terms**, where the EPP logs them: pyepp's `pick request=... scores={...}` line (every pick at
  `--v 5`, a sample at `--v 4`); llm-d-router's `Calculated score` lines at `--v=4` (`pkg/epp/scheduling/
  scheduler_profile.go`, `runScorerPlugins`: plugin `<name>/<type>`, endpoint id, raw score, with the request's
  `x-request-id` from the logger context). `terms_from_log` reads either; `attach_terms` joins them to the picks.

The format (`Pick`, one JSON object a line, `write`/`read`) is what `compare` and the CLI take:

    python -m e2e.harness.picklog convert ENVOY_ACCESS_LOG [--epp-log EPP_LOG] [--names FILE_DISCOVERY_YAML] -o A.jsonl
    python -m e2e.harness.picklog compare A.jsonl B.jsonl [--strict]  # share of identical picks, what decided the rest

Two EPPs on one replay each route for real, so after their first different pick their pods' states differ too;
`compare` reports the agreement over all picks and the run of identical picks from the start. Pods are identical
and start empty, so by default picks are compared up to a renaming of pods (`compare`): a tie broken towards
another idle pod is not a difference, nor is everything that follows from it.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from epp.framework.keys import DESTINATION_HEADER

REPLAY_HEADER = "x-replay-index"  # the request's index in the workload, sent by the load generator
REQUEST_ID_HEADER = "x-request-id"
SCORES_KEY = "x-gateway-destination-endpoint-scores"
TIE_EPS = 1e-9

# One access-log line: Envoy's substitution commands, as a JSON object (typed: metadata stays a JSON value).
ACCESS_LOG_FORMAT: dict[str, str] = {
    "replay": f"%REQ({REPLAY_HEADER.upper()})%",
    "request_id": f"%REQ({REQUEST_ID_HEADER.upper()})%",
    "pick": f"%DYNAMIC_METADATA(envoy.lb:{DESTINATION_HEADER})%",
    "scores": f"%DYNAMIC_METADATA(envoy.lb:{SCORES_KEY})%",
    "upstream": "%UPSTREAM_HOST%",
    "status": "%RESPONSE_CODE%",
    "start": "%START_TIME(%s.%3f)%",
}


@dataclass
class Pick:
    """One pick. `pod` is host:port; `scores` the weighted total per candidate (empty when the EPP emitted none);
    `terms` each scorer's raw score per candidate (empty when its log gave none)."""

    replay: int
    request_id: str
    pod: str
    scores: dict[str, float] = field(default_factory=dict)
    terms: dict[str, dict[str, float]] = field(default_factory=dict)
    status: int = 0

    def tied(self) -> bool:
        """More than one candidate holds the top total: the picker chose among equals."""
        if len(self.scores) < 2:
            return False
        top = max(self.scores.values())
        return sum(1 for v in self.scores.values() if top - v <= TIE_EPS) > 1


def write(path: Path, picks: Iterable[Pick]) -> None:
    path.write_text("".join(json.dumps(asdict(p), sort_keys=True) + "\n" for p in picks))


def read(path: Path) -> list[Pick]:
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            out.append(Pick(**d))
        except (ValueError, TypeError) as e:
            raise ValueError(f"{path}:{n}: not a pick: {e}") from e
    return out


def _blank(v: Any) -> bool:
    return v is None or v == "" or v == "-"


def from_access_log(path: Path) -> list[Pick]:
    """The picks in an access log written with ACCESS_LOG_FORMAT; lines without a replay index (warm-ups, probes)
    are skipped. The pick is the EPP's destination metadata, else the pod Envoy sent the request to."""
    picks = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
        except ValueError as e:
            raise ValueError(f"{path}:{n}: not a JSON access-log line: {e}") from e
        if _blank(d.get("replay")):
            continue
        pod = d.get("pick")
        if _blank(pod):
            pod = d.get("upstream")
        scores = d.get("scores")
        picks.append(
            Pick(
                replay=int(d["replay"]),
                request_id="" if _blank(d.get("request_id")) else str(d["request_id"]),
                pod="" if _blank(pod) else str(pod).split(",")[0],
                scores={str(k): float(v) for k, v in scores.items()} if isinstance(scores, dict) else {},
                status=int(d["status"]) if str(d.get("status", "")).isdigit() else 0,
            )
        )
    return sorted(picks, key=lambda p: p.replay)


_PYEPP_PICK = re.compile(r"pick request=(\S+) profile=(\S+) picked=(\S*) scores=(\{.*\})\s*$")


def terms_from_log(path: Path, names: Mapping[str, str] | None = None) -> dict[str, dict[str, dict[str, float]]]:
    """request id -> scorer -> pod -> raw score, from an EPP's log: pyepp's pick lines (text or JSON logs) or
    llm-d-router's `Calculated score` JSON lines. `names` maps an endpoint id as llm-d logs it (its file-discovery
    name, or namespace/name) to host:port (`discovery_names`)."""
    names = names or {}
    out: dict[str, dict[str, dict[str, float]]] = {}
    for line in path.read_text(errors="replace").splitlines():
        if "Calculated score" in line:
            try:
                d = json.loads(line[line.index("{") :])
            except ValueError:
                continue
            rid, plugin, ep = d.get(REQUEST_ID_HEADER), d.get("plugin"), d.get("endpoint")
            if rid is None or plugin is None or ep is None or "score" not in d:
                continue
            pod = _endpoint(ep, names)
            out.setdefault(str(rid), {}).setdefault(str(plugin), {})[pod] = float(d["score"])
            continue
        if "pick request=" not in line:
            continue
        text = line
        if line.lstrip().startswith("{"):
            try:
                text = str(json.loads(line).get("msg", ""))
            except ValueError:
                continue
        m = _PYEPP_PICK.search(text)
        if m is None or (m.group(2) != "default" and m.group(1) in out):
            continue  # another profile's pick (P/D) does not replace the primary one's
        try:
            per_pod: dict[str, dict[str, float]] = yaml.safe_load(m.group(4))
        except yaml.YAMLError:
            continue
        terms: dict[str, dict[str, float]] = {}
        for pod, by_term in per_pod.items():
            for term, v in by_term.items():
                if term != "total":
                    terms.setdefault(term, {})[str(pod)] = float(v)
        out[m.group(1)] = terms
    return out


def _endpoint(ep: Any, names: Mapping[str, str]) -> str:
    """An endpoint id as llm-d logs it (a NamespacedName: {"name", "namespace"} through logr, or "ns/name") as
    host:port where `names` knows it."""
    if isinstance(ep, dict):
        name, ns = str(ep.get("name", ep.get("Name", ""))), str(ep.get("namespace", ep.get("Namespace", "")))
        return names.get(f"{ns}/{name}", names.get(name, f"{ns}/{name}" if ns else name))
    text = str(ep)
    return names.get(text, names.get(text.rpartition("/")[2], text))


def attach_terms(picks: Sequence[Pick], terms: Mapping[str, dict[str, dict[str, float]]]) -> int:
    """Sets each pick's terms from `terms` (by request id); returns how many picks got some."""
    n = 0
    for p in picks:
        t = terms.get(p.request_id)
        if t:
            p.terms = t
            n += 1
    return n


def discovery_names(path: Path) -> dict[str, str]:
    """Endpoint name -> host:port from a file-discovery endpoints file (llm-d's `docs/discovery.md` format) or an
    EPP config's `endpoints:` list."""
    doc = yaml.safe_load(path.read_text()) or {}
    out = {}
    for e in doc.get("endpoints", []) or []:
        hostport = f"{e['address']}:{e['port']}"
        out[str(e["name"])] = hostport
        if e.get("namespace"):
            out[f"{e['namespace']}/{e['name']}"] = hostport
    return out


@dataclass
class Comparison:
    """Two EPPs' picks on one replay, matched by replay index."""

    matched: int = 0  # requests both logged a pick for
    same: int = 0
    ties: int = 0  # different picks where either EPP chose among tied top totals (not counted either way)
    differ: int = 0
    prefix: int = 0  # identical picks from the start, before the first difference (ties skipped)
    decided_by: Counter[str] = field(default_factory=Counter)  # for each difference: what made it
    renamed: bool = False  # identical up to a renaming of pods (see compare)

    @property
    def agreement(self) -> float:
        counted = self.same + self.differ
        return self.same / counted if counted else float("nan")

    def lines(self, a: str = "A", b: str = "B") -> list[str]:
        out = [
            f"matched picks: {self.matched}; identical: {self.same}; tied (excepted): {self.ties}; "
            f"different: {self.differ}",
            f"agreement (ties excepted{', pods renamed' if self.renamed else ''}): {self.agreement:.1%}; "
            f"identical from the start: {self.prefix}",
        ]
        for what, k in self.decided_by.most_common():
            out.append(f"  decided by {what}: {k}")
        return out


def decided_by(a: Pick, b: Pick) -> str:
    """What made two EPPs pick differently for one request.

    `filter`: the candidate sets the filters left differ (the totals' keys) and one's pick is not in the other's;
    a scorer term: of the terms both logged, the one whose preference between the two picks differs most between the
    EPPs (a's term(a.pod) - term(b.pod) against b's); `scores`: the totals rank the two pods differently and no
    terms say why; `unknown`: neither EPP emitted scores."""
    if a.scores and b.scores and (a.pod not in b.scores or b.pod not in a.scores):
        return "filter"
    common = [(t, t) for t in a.terms if t in b.terms] or _same_type_terms(a.terms, b.terms)
    best, margin = "", 0.0
    for ta, tb in common:
        da = a.terms[ta].get(a.pod, 0.0) - a.terms[ta].get(b.pod, 0.0)
        db = b.terms[tb].get(a.pod, 0.0) - b.terms[tb].get(b.pod, 0.0)
        if abs(da - db) > margin:
            best, margin = ta, abs(da - db)
    if best:
        return f"term {best}"
    if a.terms or b.terms:  # one side's terms only: the term that favoured its pick the most
        side = a if a.terms else b
        other = b.pod if side is a else a.pod
        gain = {t: v.get(side.pod, 0.0) - v.get(other, 0.0) for t, v in side.terms.items()}
        top = max(gain, key=lambda t: gain[t])
        if gain[top] > 0:
            return f"term {top} ({'A' if side is a else 'B'} only)"
    return "scores" if a.scores or b.scores else "unknown"


def _same_type_terms(ta: Mapping[str, Any], tb: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Terms of the two EPPs that name the same plugin type: pyepp logs `name*weight`, llm-d `name/type`."""

    def kind(t: str) -> str:
        return t.split("*")[0].rpartition("/")[2]

    return [(x, y) for x in ta for y in tb if kind(x) == kind(y)]


def compare(a: Sequence[Pick], b: Sequence[Pick], rename: bool = True) -> Comparison:
    """`rename`: identical up to a renaming of pods. A pod neither run had picked yet is in the same state in both
    (no load, caches as reset), so when A picks one of its unpicked pods and B one of its own, they are the same
    pick and those two pods the same pod from then on; without it, picks are identical only on the same pod (the
    first tie broken differently then makes every later pick differ)."""
    c = Comparison(renamed=rename)
    by_b = {p.replay: p for p in b if p.pod}
    b_to_a: dict[str, str] = {}
    used_a: set[str] = set()
    used_b: set[str] = set()
    diverged = False
    for pa in sorted((p for p in a if p.pod), key=lambda p: p.replay):
        pb = by_b.get(pa.replay)
        if pb is None:
            continue
        c.matched += 1
        if not rename:
            seen_as = pb.pod
        elif pb.pod in b_to_a:
            seen_as = b_to_a[pb.pod]
        elif pa.pod not in used_a and pb.pod not in used_b:
            b_to_a[pb.pod] = seen_as = pa.pod
        else:
            seen_as = ""
        used_a.add(pa.pod)
        used_b.add(pb.pod)
        if pa.pod == seen_as:
            c.same += 1
            c.prefix += not diverged
        elif pa.tied() or pb.tied():
            c.ties += 1
        else:
            c.differ += 1
            diverged = True
            c.decided_by[decided_by(pa, _renamed(pb, b_to_a) if rename else pb)] += 1
    return c


def _renamed(p: Pick, names: Mapping[str, str]) -> Pick:
    """`p` with the pods `names` maps named as in the other run (the others keep their names)."""

    def one(pod: str) -> str:
        return names.get(pod, pod)

    return Pick(
        p.replay,
        p.request_id,
        one(p.pod),
        {one(k): v for k, v in p.scores.items()},
        {t: {one(k): v for k, v in per.items()} for t, per in p.terms.items()},
        p.status,
    )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m e2e.harness.picklog", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    conv = sub.add_parser("convert", help="an Envoy access log (+ the EPP's log) to a pick log")
    conv.add_argument("access_log", type=Path)
    conv.add_argument("--epp-log", type=Path, help="the EPP's log, for per-scorer terms")
    conv.add_argument("--names", type=Path, help="file-discovery endpoints file: endpoint names to host:port")
    conv.add_argument("-o", "--out", type=Path, required=True)
    cmp = sub.add_parser("compare", help="two pick logs of one replay")
    cmp.add_argument("a", type=Path)
    cmp.add_argument("b", type=Path)
    cmp.add_argument("--strict", action="store_true", help="identical only on the same pod (no renaming)")
    ns = p.parse_args(argv)
    try:
        if ns.cmd == "convert":
            picks = from_access_log(ns.access_log)
            got = 0
            if ns.epp_log:
                names = discovery_names(ns.names) if ns.names else {}
                got = attach_terms(picks, terms_from_log(ns.epp_log, names))
            write(ns.out, picks)
            print(f"{len(picks)} picks ({got} with per-scorer terms) -> {ns.out}")
            return 0
        c = compare(read(ns.a), read(ns.b), rename=not ns.strict)
        print("\n".join(c.lines(str(ns.a), str(ns.b))))
        return 0
    except (OSError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
