"""gRPC health (grpc.health.v1) with GIE's service names; readiness follows the datastore's sync state."""

from __future__ import annotations

from grpc_health.v1 import health, health_pb2

EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
LIVENESS = "liveness"
READINESS = "readiness"
INFERENCE_EXTENSION = "inference-extension"
# Everything but liveness waits for the datastore sync (GIE: SERVING once the pool has synced, and leader).
READY_SERVICES = ("", READINESS, EXT_PROC_SERVICE, INFERENCE_EXTENSION)

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class Health:
    """Owns the aio HealthServicer; one instance is registered on both the ext_proc and the health port."""

    def __init__(self) -> None:
        self.servicer = health.aio.HealthServicer()
        self.ready = False
        self.is_draining = False

    async def start(self) -> None:
        await self.servicer.set(LIVENESS, SERVING)
        for name in READY_SERVICES:
            await self.servicer.set(name, NOT_SERVING)

    async def set_ready(self, ready: bool) -> None:
        if self.is_draining:
            return
        self.ready = ready
        for name in READY_SERVICES:
            await self.servicer.set(name, SERVING if ready else NOT_SERVING)

    async def draining(self) -> None:
        """The drain window: everything but liveness NOT_SERVING (Kubernetes takes the pod out of the endpoints;
        liveness stays SERVING so it is not restarted mid-drain), for good."""
        self.is_draining = True
        self.ready = False
        for name in READY_SERVICES:
            await self.servicer.set(name, NOT_SERVING)

    async def shutting_down(self) -> None:
        """Every service NOT_SERVING, and no later `set` can flip it back."""
        self.ready = False
        await self.servicer.enter_graceful_shutdown()
