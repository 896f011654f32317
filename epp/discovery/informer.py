"""A list+watch cache for one Kubernetes resource, the way client-go's reflector keeps one current.

It lists, hands the full set to its handler, then watches from the list's resourceVersion with bookmarks.
A stream the server ends is resumed from the last seen RV; a 410 Gone means the RV fell out of the server's
window, so it lists again. kubernetes-asyncio retries a 410 once by itself only when no timeout is passed, so we
always pass `timeout_seconds` and own every retry here. Other failures back off exponentially with jitter.
Objects are plain dicts (the JSON the server sent): no model classes on this path.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from epp.framework.verbosity import DEFAULT, V

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ResourceKind:
    """A namespaced resource: group "" is the core API (only pods are needed from it)."""

    group: str
    version: str
    plural: str

    def __str__(self) -> str:
        return f"{self.plural}.{self.group or 'core'}/{self.version}"


PODS = ResourceKind("", "v1", "pods")
INFERENCE_POOLS = ResourceKind("inference.networking.k8s.io", "v1", "inferencepools")
INFERENCE_OBJECTIVES = ResourceKind("inference.networking.x-k8s.io", "v1alpha2", "inferenceobjectives")


class InformerHandler(Protocol):
    def on_replace(self, objects: Sequence[dict[str, Any]]) -> None:
        """The complete current set (after every list, including re-lists)."""
        ...

    def on_upsert(self, obj: dict[str, Any]) -> None: ...

    def on_delete(self, obj: dict[str, Any]) -> None: ...


class Backoff:
    """Exponential backoff with full jitter on the upper half: delay in [d/2, d], d doubling up to `maximum`."""

    def __init__(self, initial: float = 0.5, maximum: float = 30.0, factor: float = 2.0) -> None:
        self.initial, self.maximum, self.factor = initial, maximum, factor
        self._next = initial

    def next(self) -> float:
        d = self._next
        self._next = min(self.maximum, self._next * self.factor)
        return random.uniform(d / 2, d)

    def reset(self) -> None:
        self._next = self.initial


@dataclass
class InformerStats:
    lists: int = 0
    watches: int = 0
    relists_after_gone: int = 0
    bookmarks: int = 0
    errors: int = 0


def object_name(obj: dict[str, Any]) -> str:
    return str(obj.get("metadata", {}).get("name", ""))


class Informer:
    """Keeps `store` (name → object) equal to the server's view of one resource in one namespace."""

    def __init__(
        self,
        api: client.ApiClient,
        kind: ResourceKind,
        namespace: str,
        handler: InformerHandler,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        watch_timeout: float = 300.0,
        backoff: Backoff | None = None,
    ) -> None:
        self.kind, self.namespace, self.handler = kind, namespace, handler
        self.label_selector, self.field_selector = label_selector, field_selector
        self.watch_timeout = watch_timeout
        self.backoff = backoff or Backoff()
        self.store: dict[str, dict[str, Any]] = {}
        self.resource_version = ""
        self.synced = asyncio.Event()
        self.stats = InformerStats()
        self._core = client.CoreV1Api(api) if kind.group == "" else None
        self._custom = client.CustomObjectsApi(api)

    def _call(self, **kwargs: Any) -> Any:
        if self.label_selector:
            kwargs["label_selector"] = self.label_selector
        if self.field_selector:
            kwargs["field_selector"] = self.field_selector
        if self._core is not None:
            if self.kind.plural != "pods":
                raise ValueError(f"core resource {self.kind} is not supported")
            return self._core.list_namespaced_pod(self.namespace, **kwargs)
        k = self.kind
        return self._custom.list_namespaced_custom_object(k.group, k.version, self.namespace, k.plural, **kwargs)

    def _list_fn(self) -> Any:
        return self._core.list_namespaced_pod if self._core is not None else self._custom.list_namespaced_custom_object

    def _list_args(self) -> tuple[Any, ...]:
        if self._core is not None:
            return (self.namespace,)
        return (self.kind.group, self.kind.version, self.namespace, self.kind.plural)

    async def run(self) -> None:
        """List and watch until cancelled."""
        need_list = True
        while True:
            try:
                if need_list:
                    await self._list()
                    need_list = False
                if not await self._watch():
                    # Ended at once with nothing in it: don't spin on a server that keeps closing streams.
                    await asyncio.sleep(self.backoff.next())
            except ApiException as e:
                if e.status == 410:
                    self.stats.relists_after_gone += 1
                    log.log(
                        V(DEFAULT),
                        "%s: resourceVersion %s expired (410 Gone); re-listing",
                        self.kind,
                        self.resource_version,
                    )
                    need_list = True
                    continue
                self._failed(f"HTTP {e.status} {e.reason}")
                if e.status == 404:
                    log.error("%s: not found; is the CRD installed and the namespace right?", self.kind)
                await asyncio.sleep(self.backoff.next())
            except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as e:
                self._failed(f"{type(e).__name__}: {e}")
                await asyncio.sleep(self.backoff.next())

    def _failed(self, why: str) -> None:
        self.stats.errors += 1
        log.warning("%s in %s: list/watch failed (%s); retrying with backoff", self.kind, self.namespace, why)

    async def _list(self) -> None:
        self.stats.lists += 1
        resp = await self._call(_preload_content=False, _request_timeout=aiohttp.ClientTimeout(total=60))
        try:
            body = await resp.read()
            if resp.status != 200:
                raise ApiException(status=resp.status, reason=body.decode(errors="replace")[:500])
        finally:
            resp.release()
        data = json.loads(body)
        items = [i for i in data.get("items") or [] if isinstance(i, dict)]
        self.resource_version = str(data.get("metadata", {}).get("resourceVersion", ""))
        self.store = {object_name(i): i for i in items}
        self.backoff.reset()
        self.handler.on_replace(items)
        self.synced.set()

    async def _watch(self) -> bool:
        """One watch request until the server ends it; False if it ended at once without any event."""
        self.stats.watches += 1
        started, events = time.monotonic(), 0
        timeout = int(random.uniform(self.watch_timeout, 2 * self.watch_timeout)) or 1
        w = watch.Watch(return_type="object")
        async with w:
            stream = w.stream(
                self._list_fn(),
                *self._list_args(),
                **self._selectors(),
                resource_version=self.resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=timeout,
                # A silent dead connection must not hang us: the server sends something well before this.
                _request_timeout=aiohttp.ClientTimeout(sock_connect=10, sock_read=timeout + 30),
            )
            async for event in stream:
                events += 1
                self._apply(event)
        return events > 0 or time.monotonic() - started >= 1.0

    def _selectors(self) -> dict[str, str]:
        out: dict[str, str] = {}
        if self.label_selector:
            out["label_selector"] = self.label_selector
        if self.field_selector:
            out["field_selector"] = self.field_selector
        return out

    def _apply(self, event: dict[str, Any]) -> None:
        etype = str(event.get("type", ""))
        obj = event.get("raw_object")
        if not isinstance(obj, dict):
            raise ValueError(f"watch event without an object: {str(event)[:200]}")
        rv = str(obj.get("metadata", {}).get("resourceVersion", ""))
        self.backoff.reset()
        try:
            if etype == "BOOKMARK":
                self.stats.bookmarks += 1
            elif etype in ("ADDED", "MODIFIED"):
                self.store[object_name(obj)] = obj
                self.handler.on_upsert(obj)
            elif etype == "DELETED":
                self.store.pop(object_name(obj), None)
                self.handler.on_delete(obj)
            else:
                log.warning("%s: ignoring watch event of type %r", self.kind, etype)
        except Exception:
            # One bad object must not stop discovery; the next re-list gives the handler another go at it.
            log.exception("%s: handler failed on %s %s", self.kind, etype, object_name(obj))
        if rv:
            self.resource_version = rv
