"""The Python floor for ext_proc: a minimal grpc.aio server speaking the same protocol as the EPP.

Same protos, same FULL_DUPLEX_STREAMED message sequence as `epp serve` (hold the request headers until the body
ends, then answer them with a fixed destination and stream the body back; pass response headers, echo response
body chunks and trailers), but no parsing, no scheduling, no metrics: what any Python ext_proc server pays for
transport and protobuf. `cost.breakdown` runs it beside the EPP behind the same Envoy configuration.

    python -m e2e.bench.cost.floor --port 9002 --destination 127.0.0.1:8000[,...] [--event-loop uvloop]

With several destinations (a simulator pool) requests go round-robin over them, as cheap a pick as there is.
"""

from __future__ import annotations

import argparse
import asyncio

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

_OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD


class FloorServicer(pb_grpc.ExternalProcessorServicer):
    def __init__(self, destination: str) -> None:
        self.destinations = [d.encode() for d in destination.split(",") if d]
        self._next = 0

    async def Process(self, request_iterator: object, context: grpc.aio.ServicerContext) -> None:
        read, write, eof = context.read, context.write, grpc.aio.EOF
        body: list[bytes] = []
        while True:
            msg = await read()
            if msg is eof:
                return
            kind = msg.WhichOneof("request")
            if kind == "request_body":
                body.append(msg.request_body.body)
                if not msg.request_body.end_of_stream:
                    continue
                raw = b"".join(body)
                self._next += 1
                dest = self.destinations[self._next % len(self.destinations)]
                mutation = pb.HeaderMutation(
                    set_headers=[
                        base_pb2.HeaderValueOption(
                            header=base_pb2.HeaderValue(key="x-gateway-destination-endpoint", raw_value=dest),
                            append_action=_OVERWRITE,
                        ),
                        base_pb2.HeaderValueOption(
                            header=base_pb2.HeaderValue(key="content-length", raw_value=str(len(raw)).encode()),
                            append_action=_OVERWRITE,
                        ),
                    ]
                )
                await write(
                    pb.ProcessingResponse(
                        request_headers=pb.HeadersResponse(
                            response=pb.CommonResponse(header_mutation=mutation, clear_route_cache=True)
                        )
                    )
                )
                resp = pb.ProcessingResponse()
                sr = resp.request_body.response.body_mutation.streamed_response
                sr.body = raw
                sr.end_of_stream = True
                await write(resp)
            elif kind == "response_headers":
                await write(pb.ProcessingResponse(response_headers=pb.HeadersResponse()))
            elif kind == "response_body":
                resp = pb.ProcessingResponse()
                sr = resp.response_body.response.body_mutation.streamed_response
                sr.body = msg.response_body.body
                sr.end_of_stream = msg.response_body.end_of_stream
                await write(resp)
            elif kind == "request_trailers":
                await write(pb.ProcessingResponse(request_trailers=pb.TrailersResponse()))
            elif kind == "response_trailers":
                await write(pb.ProcessingResponse(response_trailers=pb.TrailersResponse()))


async def serve(port: int, health_port: int, destination: str) -> None:
    server = grpc.aio.server()
    pb_grpc.add_ExternalProcessorServicer_to_server(FloorServicer(destination), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    hs = grpc.aio.server()
    checker = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(checker, hs)
    hs.add_insecure_port(f"127.0.0.1:{health_port}")
    await server.start()
    await hs.start()
    await checker.set("readiness", health_pb2.HealthCheckResponse.SERVING)
    await server.wait_for_termination()


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m e2e.bench.cost.floor")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--health-port", type=int, required=True)
    ap.add_argument("--destination", required=True, help="host:port, or a comma-separated list (round-robin)")
    ap.add_argument("--event-loop", choices=("asyncio", "uvloop"), default="asyncio")
    ns = ap.parse_args()
    factory = None
    if ns.event_loop == "uvloop":
        import uvloop

        factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(serve(ns.port, ns.health_port, ns.destination))


if __name__ == "__main__":
    main()
