"""A small but faithful fake Kubernetes API server (aiohttp) for driving the real kubernetes-asyncio client.

What it models, because the informer depends on each of these:
- one global, monotonically increasing resourceVersion (RV); every object carries the RV of its last write;
  a list returns the store's current RV;
- watch (`watch=true`, any case) streams one JSON event per line over a chunked body; from RV "" or "0" it first
  sends ADDED for every existing object, from RV N only events newer than N; an RV older than the compaction
  point gets an `ERROR` event with a 410 `Expired` Status and the stream ends;
- label selectors (`=`, `==`, `!=`, `in`, `notin`, exists, `!key`) and field selectors (`metadata.name` ...);
  with a selector, an object that stops matching is sent as DELETED and one that starts matching as ADDED;
- `allowWatchBookmarks` (periodic BOOKMARK events carrying only metadata.resourceVersion), `timeoutSeconds`
  (the server ends the stream cleanly);
- CRD paths `/apis/{group}/{version}/namespaces/{ns}/{plural}`, unknown resources → 404 Status;
- create / update / merge-patch / delete over HTTP and in-process, graceful pod deletion (deletionTimestamp);
- fault injection: failing the next N requests, ending or cutting every open watch, compaction.

Watchers scan the event log and arm their wake-up with no await in between (the clear-before-scan order below),
so no event can land between the scan and the wait.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import copy
import datetime
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.fakekube.selectors import SelectorError, field_selector, label_selector


@dataclass(frozen=True)
class Resource:
    group: str  # "" for the core API
    version: str
    plural: str
    kind: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


PODS = Resource("", "v1", "pods", "Pod")
INFERENCE_POOLS = Resource("inference.networking.k8s.io", "v1", "inferencepools", "InferencePool")
INFERENCE_OBJECTIVES = Resource(
    "inference.networking.x-k8s.io", "v1alpha2", "inferenceobjectives", "InferenceObjective"
)
LEASES = Resource("coordination.k8s.io", "v1", "leases", "Lease")


class KubeError(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message

    def status(self) -> dict[str, Any]:
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }


@dataclass
class _Event:
    rv: int
    resource: Resource
    namespace: str
    type: str  # ADDED | MODIFIED | DELETED
    obj: dict[str, Any]
    prev: dict[str, Any] | None


@dataclass(eq=False)
class _Watcher:
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    end: bool = False
    cut: bool = False
    bookmark_now: bool = False
    path: str = ""
    query: dict[str, str] = field(default_factory=dict)


@dataclass
class RequestRecord:
    method: str
    path: str
    query: dict[str, str]
    at: float

    @property
    def is_watch(self) -> bool:
        return self.query.get("watch", "").lower() in ("true", "1")


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (null deletes a key)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            result.pop(k, None)
        else:
            result[k] = merge_patch(result.get(k), v)
    return result


class FakeKube:
    """The store plus its HTTP front end. Start with `await start()`; `url` is then `http://127.0.0.1:<port>`."""

    def __init__(
        self,
        *,
        bookmark_interval: float | None = None,
        token: str | None = "fake-token",
        max_watch_seconds: float | None = None,
    ) -> None:
        self.resources: dict[tuple[str, str, str], Resource] = {}
        for r in (PODS, INFERENCE_POOLS, INFERENCE_OBJECTIVES, LEASES):
            self.register(r)
        # TokenReview / SubjectAccessReview: token -> user info, and the (user or "group:<g>", path, verb) allowed.
        self.token_users: dict[str, dict[str, Any]] = {}
        self.allowed: set[tuple[str, str, str]] = set()
        self.bookmark_interval = bookmark_interval
        self.token = token  # required as `Authorization: Bearer <token>` unless None
        self.max_watch_seconds = max_watch_seconds  # the apiserver's own cap on a watch (min-request-timeout)
        self.requests: list[RequestRecord] = []
        self._rv = 100
        self._objects: dict[Resource, dict[tuple[str, str], dict[str, Any]]] = {}
        self._log: list[_Event] = []
        self._log_rvs: list[int] = []
        self._compacted_rv = 0  # watches from an RV below this get 410
        self._watchers: set[_Watcher] = set()
        self._fail: list[list[Any]] = []  # [remaining, status code, predicate]
        self._runner: web.AppRunner | None = None
        self.url = ""

    # ---- lifecycle -------------------------------------------------------------------------------------------
    def register(self, resource: Resource) -> None:
        self.resources[(resource.group, resource.version, resource.plural)] = resource

    async def start(self, port: int = 0) -> str:
        app = web.Application()
        app.router.add_post("/apis/authentication.k8s.io/v1/tokenreviews", self._token_review)
        app.router.add_post("/apis/authorization.k8s.io/v1/subjectaccessreviews", self._access_review)
        app.router.add_route("*", "/api/{version}/namespaces/{ns}/{plural}", self._collection)
        app.router.add_route("*", "/api/{version}/namespaces/{ns}/{plural}/{name}", self._item)
        app.router.add_route("*", "/api/{version}/namespaces/{ns}/{plural}/{name}/status", self._item)
        app.router.add_route("*", "/apis/{group}/{version}/namespaces/{ns}/{plural}", self._collection)
        app.router.add_route("*", "/apis/{group}/{version}/namespaces/{ns}/{plural}/{name}", self._item)
        app.router.add_route("*", "/apis/{group}/{version}/namespaces/{ns}/{plural}/{name}/status", self._item)
        self._runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.5, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        sockets = site._server.sockets  # type: ignore[union-attr]
        self.port = sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        return self.url

    async def stop(self) -> None:
        self.cut_watches()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def kubeconfig(self, namespace: str = "default") -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": self.token or "unused"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake", "namespace": namespace}}],
            "current-context": "fake",
        }

    # ---- fault injection and observation -----------------------------------------------------------------------
    @property
    def resource_version(self) -> int:
        return self._rv

    def fail_next(self, n: int, code: int = 503, when: Callable[[RequestRecord], bool] | None = None) -> None:
        """Answer the next `n` matching requests with an error Status."""
        self._fail.append([n, code, when or (lambda r: True)])

    def end_watches(self) -> None:
        """End every open watch cleanly (what the apiserver does on its own timeout)."""
        for w in self._watchers:
            w.end = True
            w.wake.set()

    def cut_watches(self) -> None:
        """Drop every open watch connection mid-stream (a crashed apiserver or a network cut)."""
        for w in self._watchers:
            w.cut = True
            w.wake.set()

    def send_bookmarks(self) -> None:
        for w in self._watchers:
            w.bookmark_now = True
            w.wake.set()

    def compact(self) -> None:
        """Forget the event history: any watch resuming from an older RV now gets 410 Gone."""
        self._compacted_rv = self._rv
        self._log.clear()
        self._log_rvs.clear()
        for w in self._watchers:
            w.wake.set()

    @property
    def open_watches(self) -> int:
        return len(self._watchers)

    def open_watch_queries(self, plural: str) -> list[dict[str, str]]:
        """The query of each watch still open on `plural` (selectors, resourceVersion)."""
        return [w.query for w in self._watchers if w.path.endswith("/" + plural)]

    def watch_requests(self, plural: str | None = None) -> list[RequestRecord]:
        return [r for r in self.requests if r.is_watch and (plural is None or r.path.endswith("/" + plural))]

    def list_requests(self, plural: str | None = None) -> list[RequestRecord]:
        return [
            r
            for r in self.requests
            if r.method == "GET" and not r.is_watch and (plural is None or r.path.endswith("/" + plural))
        ]

    # ---- the store (in-process API) ----------------------------------------------------------------------------
    def objects(self, resource: Resource, namespace: str | None = None) -> list[dict[str, Any]]:
        store = self._objects.get(resource, {})
        return [copy.deepcopy(o) for (ns, _), o in sorted(store.items()) if namespace in (None, ns)]

    def get(self, resource: Resource, namespace: str, name: str) -> dict[str, Any]:
        obj = self._objects.get(resource, {}).get((namespace, name))
        if obj is None:
            raise KubeError(404, "NotFound", f'{resource.plural} "{name}" not found')
        return copy.deepcopy(obj)

    def create(self, resource: Resource, obj: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        ns = namespace or meta.get("namespace") or "default"
        name = meta.get("name")
        if not name:
            raise KubeError(422, "Invalid", "metadata.name: Required value")
        store = self._objects.setdefault(resource, {})
        if (ns, name) in store:
            raise KubeError(409, "AlreadyExists", f'{resource.plural} "{name}" already exists')
        obj["apiVersion"], obj["kind"] = resource.api_version, resource.kind
        meta.update(namespace=ns, uid=str(uuid.uuid4()), creationTimestamp=_now(), generation=1)
        meta.pop("deletionTimestamp", None)
        self._commit(resource, ns, name, "ADDED", obj, None)
        return copy.deepcopy(obj)

    def update(self, resource: Resource, obj: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        ns, name = meta.get("namespace") or "default", meta.get("name", "")
        old = self.get(resource, ns, name)
        sent_rv = meta.get("resourceVersion")
        if sent_rv and sent_rv != old["metadata"]["resourceVersion"]:
            raise KubeError(409, "Conflict", f'Operation cannot be fulfilled on {resource.plural} "{name}"')
        for k in ("uid", "creationTimestamp", "namespace", "deletionTimestamp"):
            if k in old["metadata"]:
                meta[k] = old["metadata"][k]
            else:
                meta.pop(k, None)
        meta["generation"] = old["metadata"]["generation"] + (obj.get("spec") != old.get("spec"))
        obj["apiVersion"], obj["kind"] = resource.api_version, resource.kind
        self._commit(resource, ns, name, "MODIFIED", obj, old)
        return copy.deepcopy(obj)

    def patch(self, resource: Resource, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        old = self.get(resource, namespace, name)
        new = merge_patch(old, patch)
        new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        new["metadata"]["name"], new["metadata"]["namespace"] = name, namespace
        return self.update(resource, new)

    def delete(self, resource: Resource, namespace: str, name: str, *, graceful: bool = False) -> dict[str, Any]:
        """Immediate delete, or (graceful) set deletionTimestamp first like a pod with a grace period."""
        old = self.get(resource, namespace, name)
        if graceful and not old["metadata"].get("deletionTimestamp"):
            new = copy.deepcopy(old)
            new["metadata"]["deletionTimestamp"] = _now()
            new["metadata"]["deletionGracePeriodSeconds"] = 30
            self._commit(resource, namespace, name, "MODIFIED", new, old)
            return new
        self._commit(resource, namespace, name, "DELETED", old, old)
        return old

    def _commit(
        self, res: Resource, ns: str, name: str, etype: str, obj: dict[str, Any], prev: dict[str, Any] | None
    ) -> None:
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        store = self._objects.setdefault(res, {})
        if etype == "DELETED":
            store.pop((ns, name), None)
        else:
            store[(ns, name)] = obj
        self._log.append(_Event(self._rv, res, ns, etype, copy.deepcopy(obj), prev))
        self._log_rvs.append(self._rv)
        for w in self._watchers:
            w.wake.set()

    # ---- HTTP --------------------------------------------------------------------------------------------------
    def _resource(self, request: web.Request) -> Resource:
        info = request.match_info
        key = (info.get("group", ""), info["version"], info["plural"])
        res = self.resources.get(key)
        if res is None:
            raise KubeError(404, "NotFound", f"the server could not find the requested resource ({request.path})")
        return res

    def _record(self, request: web.Request) -> RequestRecord:
        rec = RequestRecord(request.method, request.path, dict(request.query), time.monotonic())
        self.requests.append(rec)
        if self.token is not None and request.headers.get("Authorization") != f"Bearer {self.token}":
            raise KubeError(401, "Unauthorized", "Unauthorized")
        for entry in self._fail:
            if entry[0] > 0 and entry[2](rec):
                entry[0] -= 1
                raise KubeError(entry[1], "ServiceUnavailable", "injected failure")
        return rec

    @staticmethod
    def _error(e: KubeError) -> web.Response:
        return web.json_response(e.status(), status=e.code)

    async def _body(self, request: web.Request) -> dict[str, Any]:
        try:
            body = await request.json()
        except json.JSONDecodeError:
            raise KubeError(400, "BadRequest", "request body is not valid JSON") from None
        if not isinstance(body, dict):
            raise KubeError(400, "BadRequest", "request body must be an object")
        return body

    async def _token_review(self, request: web.Request) -> web.StreamResponse:
        """authentication.k8s.io/v1 TokenReview against `token_users`."""
        try:
            self._record(request)
            body = await self._body(request)
            user = self.token_users.get(str((body.get("spec") or {}).get("token") or ""))
            status: dict[str, Any] = {"authenticated": user is not None}
            if user is not None:
                status["user"] = {"username": user["username"], "uid": user.get("uid", ""),
                                  "groups": list(user.get("groups", []))}  # fmt: skip
            body.update(apiVersion="authentication.k8s.io/v1", kind="TokenReview", status=status)
            return web.json_response(body, status=201)
        except KubeError as e:
            return self._error(e)

    async def _access_review(self, request: web.Request) -> web.StreamResponse:
        """authorization.k8s.io/v1 SubjectAccessReview (non-resource attributes) against `allowed`."""
        try:
            self._record(request)
            body = await self._body(request)
            spec = body.get("spec") or {}
            attrs = spec.get("nonResourceAttributes") or {}
            if not attrs:
                raise KubeError(422, "Invalid", "spec: only nonResourceAttributes are modelled")
            subjects = [spec.get("user", "")] + [f"group:{g}" for g in spec.get("groups") or []]
            ok = any((sub, attrs.get("path"), attrs.get("verb")) in self.allowed for sub in subjects)
            body.update(apiVersion="authorization.k8s.io/v1", kind="SubjectAccessReview", status={"allowed": ok})
            return web.json_response(body, status=201)
        except KubeError as e:
            return self._error(e)

    async def _collection(self, request: web.Request) -> web.StreamResponse:
        try:
            rec = self._record(request)
            res = self._resource(request)
            ns = request.match_info["ns"]
            if request.method == "GET":
                if rec.is_watch:
                    return await self._watch(request, res, ns)
                return self._list(request, res, ns)
            if request.method == "POST":
                return web.json_response(self.create(res, await self._body(request), ns), status=201)
            raise KubeError(405, "MethodNotAllowed", f"{request.method} not allowed")
        except KubeError as e:
            return self._error(e)

    async def _item(self, request: web.Request) -> web.StreamResponse:
        try:
            self._record(request)
            res = self._resource(request)
            ns, name = request.match_info["ns"], request.match_info["name"]
            if request.method == "GET":
                return web.json_response(self.get(res, ns, name))
            if request.method == "PUT":
                body = await self._body(request)
                body.setdefault("metadata", {}).update(namespace=ns, name=name)
                return web.json_response(self.update(res, body))
            if request.method == "PATCH":
                return web.json_response(self.patch(res, ns, name, await self._body(request)))
            if request.method == "DELETE":
                graceful = request.query.get("gracePeriodSeconds", "0") != "0"
                return web.json_response(self.delete(res, ns, name, graceful=graceful))
            raise KubeError(405, "MethodNotAllowed", f"{request.method} not allowed")
        except KubeError as e:
            return self._error(e)

    @staticmethod
    def _predicate(request: web.Request) -> Callable[[dict[str, Any]], bool]:
        try:
            labels = label_selector(request.query.get("labelSelector"))
            fields = field_selector(request.query.get("fieldSelector"))
        except SelectorError as e:
            raise KubeError(400, "BadRequest", f"unable to parse requirement: {e}") from None
        return lambda o: labels(o.get("metadata", {}).get("labels") or {}) and fields(o)

    def _list(self, request: web.Request, res: Resource, ns: str) -> web.Response:
        match = self._predicate(request)
        items = [o for o in self.objects(res, ns) if match(o)]
        return web.json_response(
            {
                "kind": f"{res.kind}List",
                "apiVersion": res.api_version,
                "metadata": {"resourceVersion": str(self._rv)},
                "items": items,
            }
        )

    @staticmethod
    def _line(etype: str, obj: dict[str, Any]) -> bytes:
        return json.dumps({"type": etype, "object": obj}, separators=(",", ":")).encode() + b"\n"

    def _translate(self, ev: _Event, res: Resource, ns: str, match: Callable[[dict[str, Any]], bool]) -> bytes | None:
        """The event as this watcher sees it: selector transitions become ADDED / DELETED."""
        if ev.resource != res or ev.namespace != ns:
            return None
        if ev.type == "ADDED":
            return self._line("ADDED", ev.obj) if match(ev.obj) else None
        if ev.type == "DELETED":
            return self._line("DELETED", ev.obj) if match(ev.obj) else None
        now, before = match(ev.obj), ev.prev is not None and match(ev.prev)
        if now and before:
            return self._line("MODIFIED", ev.obj)
        if now:
            return self._line("ADDED", ev.obj)
        if before:
            return self._line("DELETED", ev.obj)
        return None

    def _gone(self, rv: int) -> bytes:
        status = KubeError(410, "Expired", f"too old resource version: {rv} ({self._compacted_rv})").status()
        return self._line("ERROR", status)

    async def _watch(self, request: web.Request, res: Resource, ns: str) -> web.StreamResponse:
        match = self._predicate(request)
        q = request.query
        rv_param = q.get("resourceVersion", "")
        try:
            start_rv = int(rv_param) if rv_param not in ("", "0") else None
            timeout = float(q["timeoutSeconds"]) if q.get("timeoutSeconds") else None
            if self.max_watch_seconds is not None:
                timeout = min(timeout, self.max_watch_seconds) if timeout is not None else self.max_watch_seconds
        except ValueError:
            raise KubeError(400, "BadRequest", "resourceVersion and timeoutSeconds must be integers") from None
        bookmarks = q.get("allowWatchBookmarks", "").lower() in ("true", "1")
        resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout if timeout is not None else None
        watcher = _Watcher(path=request.path, query=dict(request.query))
        self._watchers.add(watcher)
        try:
            if start_rv is None:
                start_rv = self._rv
                for o in self.objects(res, ns):
                    if match(o):
                        await resp.write(self._line("ADDED", o))
            elif start_rv < self._compacted_rv:
                await resp.write(self._gone(start_rv))
                return await self._finish(resp)
            last_rv = start_rv
            next_bookmark = loop.time() + self.bookmark_interval if self.bookmark_interval else None
            while True:
                watcher.wake.clear()  # before the scan: any later commit sets it again
                if last_rv < self._compacted_rv:
                    await resp.write(self._gone(last_rv))
                    break
                pending = self._log[bisect.bisect_right(self._log_rvs, last_rv) :]
                for ev in pending:
                    line = self._translate(ev, res, ns, match)
                    last_rv = ev.rv
                    if line is not None:
                        await resp.write(line)
                if watcher.cut:
                    if request.transport is not None:
                        request.transport.close()
                    return resp
                if watcher.end:
                    break
                now = loop.time()
                if bookmarks and (watcher.bookmark_now or (next_bookmark is not None and now >= next_bookmark)):
                    watcher.bookmark_now = False
                    # Everything up to last_rv has been scanned for this watcher, even events it filtered out.
                    mark = {
                        "kind": res.kind,
                        "apiVersion": res.api_version,
                        "metadata": {"resourceVersion": str(last_rv)},
                    }
                    await resp.write(self._line("BOOKMARK", mark))
                    if self.bookmark_interval:
                        next_bookmark = now + self.bookmark_interval
                if deadline is not None and now >= deadline:
                    break
                waits = [t for t in (deadline, next_bookmark if bookmarks else None) if t is not None]
                wait_for = max(0.0, min(waits) - now) if waits else None
                if watcher.wake.is_set():
                    continue
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(watcher.wake.wait(), wait_for)
            return await self._finish(resp)
        except (ConnectionResetError, asyncio.CancelledError):
            return resp
        finally:
            self._watchers.discard(watcher)

    @staticmethod
    async def _finish(resp: web.StreamResponse) -> web.StreamResponse:
        with contextlib.suppress(ConnectionResetError):
            await resp.write_eof()
        return resp


def pod(
    name: str,
    ip: str | None,
    labels: dict[str, str],
    *,
    ready: bool = True,
    annotations: dict[str, str] | None = None,
    namespace: str = "default",
) -> dict[str, Any]:
    """A Pod manifest with the status fields discovery reads (podIP, Ready condition)."""
    status: dict[str, Any] = {
        "phase": "Running" if ready else "Pending",
        "conditions": [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Ready", "status": "True" if ready else "False"},
        ],
    }
    if ip:
        status["podIP"] = ip
        status["podIPs"] = [{"ip": ip}]
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": dict(labels)}
    if annotations:
        meta["annotations"] = dict(annotations)
    return {"metadata": meta, "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai"}]}, "status": status}


def ready_patch(ready: bool) -> dict[str, Any]:
    """A merge patch flipping a pod's Ready condition (conditions are replaced as a whole, like a status update)."""
    return {
        "status": {
            "phase": "Running" if ready else "Pending",
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Ready", "status": "True" if ready else "False"},
            ],
        }
    }


def inference_pool(
    name: str, match_labels: dict[str, str], target_ports: list[int], namespace: str = "default"
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "selector": {"matchLabels": dict(match_labels)},
            "targetPorts": [{"number": p} for p in target_ports],
            "endpointPickerRef": {"name": f"{name}-epp", "port": {"number": 9002}, "failureMode": "FailOpen"},
        },
    }


def inference_objective(
    name: str,
    priority: int | None,
    pool: str,
    *,
    group: str = "inference.networking.k8s.io",
    namespace: str = "default",
) -> dict[str, Any]:
    spec: dict[str, Any] = {"poolRef": {"name": pool, "group": group, "kind": "InferencePool"}}
    if priority is not None:
        spec["priority"] = priority
    return {"metadata": {"name": name, "namespace": namespace}, "spec": spec}
