"""header-based-testing-filter (GIE conformance): keeps the endpoints the `test-epp-endpoint-selection` header
names (comma-separated `ip` or `ip:port`, in header order, one per IP); none when the header is absent.
For conformance tests only: it lets a test choose the destination."""

from __future__ import annotations

from collections.abc import Sequence

from epp.framework import CycleState, Endpoint, InferenceRequest, Plugin

HEADER = "test-epp-endpoint-selection"


def _split(item: str) -> tuple[str, str]:
    item = item.strip()
    if item.startswith("["):  # [v6]:port or [v6]
        host, _, rest = item[1:].partition("]")
        return host, rest[1:] if rest.startswith(":") else ""
    if item.count(":") == 1:
        host, _, port = item.partition(":")
        return host, port
    return item, ""


class HeaderBasedTestingFilter(Plugin):
    type_name = "header-based-testing-filter"

    def filter(self, state: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> list[Endpoint]:
        hv = request.headers.get(HEADER, "")
        if not hv.strip():
            return []
        by_ip = {ep.address.strip("[]"): ep for ep in endpoints}
        by_hp = {f"{ep.address.strip('[]')}:{ep.port}": ep for ep in endpoints}
        out: list[Endpoint] = []
        seen: set[str] = set()
        for raw in hv.split(","):
            if not raw.strip():
                continue
            host, port = _split(raw)
            ep = by_hp.get(f"{host}:{port}") if port else by_ip.get(host)
            if ep is not None and ep.address not in seen:
                seen.add(ep.address)
                out.append(ep)
        return out
