"""`python -m epp.healthcheck`: a tiny gRPC health probe for the container HEALTHCHECK (exit 0 = SERVING).

Kubernetes uses its native gRPC probes; Docker and Compose have no such thing, so the image ships this.
"""

from __future__ import annotations

import argparse
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def check(address: str, service: str = "", timeout: float = 2.0) -> tuple[bool, str]:
    """(serving?, what happened) for one Health/Check call."""
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            resp = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        except grpc.RpcError as e:
            code = e.code() if isinstance(e, grpc.Call) else None
            return False, f"{code.name if code else 'error'}: {e.details() if isinstance(e, grpc.Call) else e}"
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
    return resp.status == health_pb2.HealthCheckResponse.SERVING, status


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m epp.healthcheck", description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=9003, help="the EPP's gRPC health port")
    p.add_argument("--service", default="", help='health service name ("" = the whole server)')
    p.add_argument("--timeout", type=float, default=2.0, help="seconds")
    args = p.parse_args(argv)
    ok, what = check(f"{args.host}:{args.port}", args.service, args.timeout)
    print(f"{args.host}:{args.port} service={args.service!r}: {what}", file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
