"""Endpoint health: stop routing to a dead or hung model server quickly, and route to it again once it answers.

Signals (written into `Endpoint.health`):
- the metrics scraper: consecutive failed scrapes (connection refused, timeout, non-200, unparsable page), and the
  time of the last good one;
- routed responses: consecutive 5xx answers (the server's own, or Envoy's local 502/503/504 when it cannot reach
  the server), as Envoy's outlier detection counts them.

An endpoint is not a candidate while (a) `max_scrape_failures` scrapes in a row failed (a dead pod refuses the
connection: ~2 scrape intervals), (b) its last good scrape is older than `stale_after` (a hung pod, e.g.
SIGSTOPped, accepts the connection and never answers: GIE's stale-metrics rule, applied in candidate selection
rather than only in saturation), or (c) it was ejected for `ejection` seconds after `max_server_errors` 5xx in a
row. One good scrape brings it back (a and b). Endpoints never scraped are not judged by (b). If every candidate is
unhealthy the filter fails open and keeps them all: routing to a possibly-dead pod beats refusing every request.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client import Counter

from epp.framework.types import Endpoint
from epp.framework.verbosity import DEFAULT, V

log = logging.getLogger(__name__)

UNHEALTHY = Counter(
    "pyepp_endpoint_unhealthy",
    "Times an endpoint was taken out of the candidates, by signal (scrape_failures, server_errors)",
    ["reason"],
)
FAIL_OPEN = Counter(
    "pyepp_endpoint_health_fail_open", "Requests for which every candidate was unhealthy (all kept)"
)  # fmt: skip
for _reason in ("scrape_failures", "server_errors"):
    UNHEALTHY.labels(_reason)


@dataclass
class HealthPolicy:
    enabled: bool = True
    max_scrape_failures: int = 2
    stale_after: float = 1.0  # seconds since the last good scrape
    max_server_errors: int = 5
    ejection: float = 5.0  # seconds out after max_server_errors consecutive 5xx


# The process-wide policy (`epp serve --endpoint-stale-after ...`).
POLICY = HealthPolicy()


def scrape_ok(ep: Endpoint, now: float) -> None:
    h = ep.health
    if h.scrape_failures >= POLICY.max_scrape_failures:
        log.log(V(DEFAULT), "endpoint %s: scrapes succeed again; back among the candidates", ep.name)
    h.scrape_failures = 0
    h.last_ok = now


def scrape_failed(ep: Endpoint) -> None:
    h = ep.health
    h.scrape_failures += 1
    if h.scrape_failures == POLICY.max_scrape_failures:
        UNHEALTHY.labels("scrape_failures").inc()
        log.warning("endpoint %s: %d scrapes failed in a row; not routing to it", ep.name, h.scrape_failures)


def response_status(ep: Endpoint, status: int, now: float) -> None:
    """A routed request's response status (5xx counts against the endpoint, anything else resets the count)."""
    h = ep.health
    if status >= 500:
        h.server_errors += 1
        if h.server_errors >= POLICY.max_server_errors:
            h.server_errors = 0
            h.ejected_until = now + POLICY.ejection
            UNHEALTHY.labels("server_errors").inc()
            log.warning(
                "endpoint %s: %d 5xx answers in a row; not routing to it for %.1f s",
                ep.name, POLICY.max_server_errors, POLICY.ejection,
            )  # fmt: skip
    elif status > 0:
        h.server_errors = 0


def is_healthy(ep: Endpoint, now: float, policy: HealthPolicy = POLICY) -> bool:
    h = ep.health
    return (
        h.scrape_failures < policy.max_scrape_failures
        and h.ejected_until <= now
        and (h.last_ok == 0.0 or now - h.last_ok <= policy.stale_after)
    )


def healthy_candidates(endpoints: Sequence[Endpoint], now: float | None = None) -> list[Endpoint]:
    """The healthy ones, in order; all of them if none is healthy (fail open)."""
    policy = POLICY
    if not policy.enabled:
        return list(endpoints)
    t = time.monotonic() if now is None else now
    out = [ep for ep in endpoints if is_healthy(ep, t, policy)]
    if out or not endpoints:
        return out
    FAIL_OPEN.inc()
    return list(endpoints)
