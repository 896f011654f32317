"""`--metrics-endpoint-auth` (default true, as the anchors): controller-runtime's WithAuthenticationAndAuthorization
for the metrics port. A request needs `Authorization: Bearer <token>`; the token is authenticated with a TokenReview
and the user authorized with a SubjectAccessReview for the request's non-resource path and verb (`get /metrics`),
both through the Kubernetes API. No or a bad token is 401, a user without the permission 403. Answers are cached
briefly (10 s for allowed, 2 s for denied) so a Prometheus scrape every few seconds costs no API call each time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

log = logging.getLogger(__name__)

ALLOW_TTL = 10.0
DENY_TTL = 2.0
MAX_CACHE = 1024

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class KubeAuthorizer:
    def __init__(self, api: client.ApiClient) -> None:
        # Any: the reviews go as plain dicts
        self.authn: Any = client.AuthenticationV1Api(api)
        self.authz: Any = client.AuthorizationV1Api(api)
        self._cache: dict[tuple[str, str, str], tuple[float, int]] = {}
        self.api_calls = 0

    async def check(self, token: str, path: str, verb: str) -> int:
        """200 (allowed), 401 (not authenticated) or 403 (not authorized)."""
        key = (token, path, verb)
        hit = self._cache.get(key)
        now = time.monotonic()
        if hit is not None and hit[0] > now:
            return hit[1]
        status = await self._review(token, path, verb)
        if len(self._cache) >= MAX_CACHE:
            self._cache = {k: v for k, v in self._cache.items() if v[0] > now}
            if len(self._cache) >= MAX_CACHE:
                self._cache.clear()
        self._cache[key] = (now + (ALLOW_TTL if status == 200 else DENY_TTL), status)
        return status

    async def _review(self, token: str, path: str, verb: str) -> int:
        self.api_calls += 1
        review = await self.authn.create_token_review(
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}
        )
        status: Any = review.status
        if status is None or not status.authenticated or status.user is None:
            return 401
        user = status.user
        sar = await self.authz.create_subject_access_review(
            {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": {
                    "user": user.username,
                    "uid": user.uid,
                    "groups": list(user.groups or []),
                    "extra": {k: list(v) for k, v in (user.extra or {}).items()},
                    "nonResourceAttributes": {"path": path, "verb": verb},
                },
            }
        )
        return 200 if sar.status is not None and sar.status.allowed else 403


def auth_middleware(authorizer: KubeAuthorizer) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return web.Response(status=401, text="Unauthorized\n")
        try:
            status = await authorizer.check(token.strip(), request.path, request.method.lower())
        except (ApiException, OSError) as e:
            log.warning("metrics auth: review failed: %s", e)
            return web.Response(status=500, text="authentication/authorization review failed\n")
        if status == 401:
            return web.Response(status=401, text="Unauthorized\n")
        if status == 403:
            return web.Response(status=403, text=f"Forbidden: get {request.path}\n")
        return await handler(request)

    return middleware
