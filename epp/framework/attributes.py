"""Endpoint attributes and request data of llm-d-router's catalog plugins (topology, session, agent identity).

Like `keys`, these are the typed values plugins exchange; each plugin's private keys stay in its own module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from epp.framework.state import DataKey


@dataclass(frozen=True, slots=True)
class Topology:
    """Where an endpoint runs (topology-extractor, from pod labels). Empty = unknown: never matches anything."""

    hostname: str = ""
    rack: str = ""
    zone: str = ""
    region: str = ""

    def empty(self) -> bool:
        return not (self.hostname or self.rack or self.zone or self.region)


# An endpoint attribute (`endpoint.attributes`), per producer: `TOPOLOGY.of(<topology-extractor name>)`.
TOPOLOGY: Final = DataKey[Topology]("topology")

# The request's session id (session-id-producer), in `request.data`.
SESSION_ID: Final = DataKey[str]("session-id")

# The request's agent identity (agent-identity), in `request.data`: the fairness id flow control uses when the
# client sent none.
AGENT_ID: Final = DataKey[str]("agent-identity")

# Dynamic metadata for Envoy on the response's last body message, namespace → {key: value}, in `request.data`
# (request-attribute-reporter); the server sends it with the end of the stream.
RESPONSE_METADATA: Final = DataKey[dict[str, dict[str, float]]]("response-dynamic-metadata")
