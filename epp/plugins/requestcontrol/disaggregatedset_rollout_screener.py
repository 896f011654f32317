"""disaggregatedset-rollout-screener (llm-d-router): during a DisaggregatedSet rollout, keeps every request on one
revision, so a prefill pod and a decode pod of different revisions never pair.

Per request (before admission and every profile): with a `strict` header selector present, only the endpoints
whose label equals the header are kept (none: 503). Otherwise, with `revisionGating.mode` `sum` or `max-role`,
revisions missing a Ready pod of any `requireRoles.values` role are dropped and one revision is drawn at random,
weighted by its Ready pods (`sum`: across the required roles; `max-role`: of the role with the most pods overall),
and only its endpoints continue (no complete revision: 503). `disabled` skips gating. Pods are those matching
`scope.labelSelector`; a pod counts once however many rank ports it has. Every header selector stamps the served
endpoint's label into its response header (`prefer` selectors only stamp: a header-label-affinity-scorer applies
the preference).
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Self

from epp.framework import (
    Endpoint,
    EndpointView,
    InferenceRequest,
    Params,
    Plugin,
    PluginContext,
    Response,
    ServiceUnavailable,
    Stability,
)
from epp.plugins.contracts.labels import Requirement

REVISION_LABEL = "disaggregatedset.x-k8s.io/revision"
ROLE_LABEL = "disaggregatedset.x-k8s.io/role"
_SET_RE = re.compile(r"^\s*([^\s!=()]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def parse_label_selector(text: str) -> list[Requirement]:
    """A Kubernetes label selector string: `k=v`, `k==v`, `k!=v`, `k`, `!k`, `k in (a,b)`, `k notin (a,b)`."""
    out: list[Requirement] = []
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    for raw in (p.strip() for p in parts):
        if not raw:
            continue
        m = _SET_RE.match(raw)
        if m:
            vals = frozenset(v.strip() for v in m.group(3).split(",") if v.strip())
            out.append(Requirement(m.group(1), "In" if m.group(2) == "in" else "NotIn", vals))
        elif "!=" in raw:
            k, v = raw.split("!=", 1)
            out.append(Requirement(k.strip(), "NotIn", frozenset([v.strip()])))
        elif "=" in raw:
            k, v = raw.replace("==", "=").split("=", 1)
            out.append(Requirement(k.strip(), "In", frozenset([v.strip()])))
        elif raw.startswith("!"):
            out.append(Requirement(raw[1:].strip(), "DoesNotExist", frozenset()))
        elif re.fullmatch(r"[A-Za-z0-9._/-]+", raw):
            out.append(Requirement(raw, "Exists", frozenset()))
        else:
            raise ValueError(f"cannot parse {raw!r}")
    return out


@dataclass(frozen=True, slots=True)
class HeaderSelector:
    name: str
    header: str
    label: str
    strict: bool


class DisaggregatedSetRolloutScreener(Plugin):
    type_name = "disaggregatedset-rollout-screener"
    stability = Stability.ALPHA

    def __init__(
        self,
        name: str,
        view: EndpointView,
        scope: list[Requirement],
        selectors: list[HeaderSelector],
        mode: str,
        roles: list[str],
        revision_label: str = REVISION_LABEL,
        role_label: str = ROLE_LABEL,
        rng: random.Random | None = None,
    ) -> None:
        super().__init__(name)
        self.view, self.scope, self.selectors = view, scope, selectors
        self.mode, self.roles = mode, roles
        self.revision_label, self.role_label = revision_label, role_label
        self.rng = rng or random.Random()

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        scope = params.section("scope")
        text = scope.str("labelSelector", "")
        if not text.strip():
            raise scope.fail("labelSelector", "required")
        try:
            reqs = parse_label_selector(text)
        except ValueError as e:
            raise scope.fail("labelSelector", str(e)) from None
        selectors = []
        for i, raw in enumerate(params.list("headerSelectors")):
            sp = Params(name, raw, path=f"headerSelectors[{i}]")
            sel = HeaderSelector(
                sp.str("name", ""),
                sp.str("headerName", "").lower(),
                sp.str("labelKey", ""),
                sp.str("mode", "", choices=("strict", "prefer")) == "strict",
            )
            for key, v in (("name", sel.name), ("headerName", sel.header), ("labelKey", sel.label)):
                if not v:
                    raise sp.fail(key, "required")
            unknown = sp.unread_error()
            if unknown is not None:
                raise unknown
            selectors.append(sel)
        if not params.has("revisionGating"):
            raise params.fail("revisionGating", "required (mode: sum, max-role or disabled)")
        gating = params.section("revisionGating")
        mode = gating.str("mode", "", choices=("sum", "max-role", "disabled"))
        roles = [str(r) for r in gating.section("requireRoles").list("values")]
        revision_label = gating.str("revisionLabelKey", REVISION_LABEL) or REVISION_LABEL
        role_label = gating.str("roleLabelKey", ROLE_LABEL) or ROLE_LABEL
        unknown = gating.unread_error()  # before the checks below, so a misspelt key is named as such
        if unknown is not None:
            raise unknown
        if mode != "disabled" and not roles:
            raise gating.fail("requireRoles", f"requireRoles.values is required for mode {mode}")
        return cls(name, context.endpoints, reqs, selectors, mode, roles, revision_label, role_label)

    def _in_scope(self, ep: Endpoint) -> bool:
        return all(r.matches(ep.labels) for r in self.scope)

    def revision_weights(self) -> dict[str, float]:
        """Complete revisions → weight, from the Ready pods the pool has now."""
        pods: dict[tuple[str, str], set[str]] = {}
        for ep in self.view.endpoints():
            if not self._in_scope(ep):
                continue
            rev, role = ep.labels.get(self.revision_label), ep.labels.get(self.role_label)
            if rev and role in self.roles:
                pods.setdefault((rev, role), set()).add(ep.pod_name)
        revisions = {rev for rev, _ in pods}
        complete = sorted(r for r in revisions if all(pods.get((r, role)) for role in self.roles))
        if self.mode == "sum":
            return {r: float(sum(len(pods.get((r, role), ())) for role in self.roles)) for r in complete}
        totals = {role: sum(len(pods.get((r, role), ())) for r in complete) for role in self.roles}
        dominant = max(self.roles, key=lambda role: (totals[role], -self.roles.index(role)))
        return {r: float(len(pods.get((r, dominant), ()))) for r in complete}

    def screen(self, request: InferenceRequest, candidates: Sequence[Endpoint]) -> list[Endpoint]:
        kept = list(candidates)
        strict_applied = False
        for sel in self.selectors:
            if not sel.strict:
                continue
            want = request.headers.get(sel.header, "").strip()
            if not want:
                continue
            kept = [ep for ep in kept if ep.labels.get(sel.label) == want]
            strict_applied = True
            if not kept:
                raise ServiceUnavailable(f"no endpoint has {sel.label}={want!r} ({sel.header})")
        if strict_applied or self.mode == "disabled":
            return kept
        weights = self.revision_weights()
        if not weights or sum(weights.values()) <= 0:
            raise ServiceUnavailable("no DisaggregatedSet revision has a Ready pod of every required role")
        revs = list(weights)
        chosen = self.rng.choices(revs, weights=[weights[r] for r in revs])[0]
        kept = [ep for ep in kept if ep.labels.get(self.revision_label) == chosen]
        if not kept:
            raise ServiceUnavailable(f"no candidate endpoint of revision {chosen!r}")
        return kept

    def response_received(self, request: InferenceRequest, response: Response, endpoint: Endpoint | None) -> None:
        if endpoint is None:
            return
        for sel in self.selectors:
            v = endpoint.labels.get(sel.label)
            if v:
                response.set_headers[sel.header] = v
