"""Bounded, sanitised Prometheus label values for anything a client chooses (model names, fairness ids).

Every distinct label value adds series to `/metrics` (~22 KB per model name across the request histograms), so a
client sending random model names could grow the page and the EPP's memory without bound. A `LabelBudget` admits
at most `limit` distinct values, first come (plus the names the config knows, which are always admitted), and
folds the rest into one value, `OTHER`. Admitted values are sanitised once: cut to `MAX_LABEL_CHARS` characters,
and characters that UTF-8 cannot encode (lone surrogates, which JSON's `\\ud800` escapes produce) replaced, since
prometheus_client would fail every later scrape on them. Admission is monotone (a value never leaves), so a
request sees the same label at its start and at its end.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

log = logging.getLogger(__name__)

OTHER = "__other__"
MAX_LABEL_CHARS = 128
DEFAULT_MAX_MODEL_LABELS = 100


def sanitize_label(value: str) -> str:
    """A label value prometheus_client can always render: at most MAX_LABEL_CHARS, valid UTF-8."""
    if len(value) > MAX_LABEL_CHARS:
        value = value[:MAX_LABEL_CHARS]
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        value = value.encode("utf-8", "replace").decode("utf-8")
    return value


class LabelBudget:
    """At most `limit` distinct client-chosen values become labels; the rest are folded into OTHER."""

    __slots__ = ("_admitted", "_known", "folded", "limit", "what")

    def __init__(self, limit: int = DEFAULT_MAX_MODEL_LABELS, known: Iterable[str] = (), what: str = "value") -> None:
        self.limit = limit
        self.what = what
        self._admitted: dict[str, str] = {}
        self._known: set[str] = set()
        self.folded = 0  # values folded into OTHER so far
        self.add_known(known)

    def add_known(self, names: Iterable[str]) -> None:
        """Names the config knows (model rewrites, objectives): always admitted, not counted against the limit."""
        for name in names:
            if name and name not in self._known:
                self._known.add(name)
                self._admitted[name] = sanitize_label(name)

    def label(self, value: str) -> str:
        got = self._admitted.get(value)
        if got is not None:
            return got
        if len(self._admitted) - len(self._known) >= self.limit:
            if not self.folded:
                log.warning(
                    "more than %d distinct %ss seen: further ones are counted under the label %r", self.limit,
                    self.what, OTHER,
                )  # fmt: skip
            self.folded += 1
            return OTHER
        got = self._admitted[value] = sanitize_label(value)
        return got

    def __len__(self) -> int:
        return len(self._admitted)


# The process-wide budget for model names (incoming and target), shared by every metric labelled with them.
MODEL_LABELS = LabelBudget(what="model name")
# Fairness ids come from a request header (x-gateway-inference-fairness-id).
FAIRNESS_LABELS = LabelBudget(what="fairness id")


def configure_label_budgets(max_model_labels: int, known_models: Iterable[str] = ()) -> None:
    """Set the bound (`epp serve --metrics-max-model-labels`) and the names the config knows."""
    MODEL_LABELS.limit = max_model_labels
    MODEL_LABELS.add_known(known_models)
    FAIRNESS_LABELS.limit = max_model_labels
