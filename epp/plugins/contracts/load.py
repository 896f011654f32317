"""In-flight load: the requests and tokens each endpoint is serving, from the inflight-load-producer."""

from __future__ import annotations

from typing import Final

from epp.framework import INFLIGHT_LOAD, Feed

INFLIGHT_PRODUCER: Final = "inflight-load-producer"

# A consumer's `inFlightLoadProducerName`; without it, the inflight-load-producer is added.
INFLIGHT: Final = Feed(INFLIGHT_LOAD, "inFlightLoadProducerName", INFLIGHT_PRODUCER)
