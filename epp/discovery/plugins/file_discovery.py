"""file-discovery (llm-d-router, `dataLayer.discovery.pluginRef`): the pool's endpoints from a YAML/JSON file,
for EPPs run without Kubernetes (bare metal, Slurm, Ray, local development).

The file is `endpoints: [{name, namespace?, address (IPv4), port ("8000"), labels?}]`, at most 1 MiB. A file that
cannot be read or parsed stops startup; a bad entry is logged and skipped. With `watchFile: true` the file is
re-read when it changes (checked every second: a rename or a ConfigMap symlink swap is seen too) and endpoints
missing from the new version are removed.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
from collections.abc import Callable
from typing import Any, Self

import yaml

from epp.datalayer.datastore import Datastore
from epp.framework import Endpoint, Params, Plugin, PluginContext
from epp.framework.verbosity import DEFAULT, V

log = logging.getLogger(__name__)

MAX_FILE_BYTES = 1 << 20
POLL_SECONDS = 1.0


class FileDiscoveryError(ValueError):
    pass


def ipv4_address(address: str) -> str | None:
    """A pod's address must be an IPv4 address (as llm-d-router's file discovery): the reason it is not, else None."""
    try:
        ipaddress.IPv4Address(address)
    except ValueError:
        return "is not an IPv4 address"
    return None


def parse_endpoints(
    text: str, source: str, check_address: Callable[[str], str | None] = ipv4_address
) -> list[Endpoint]:
    """The file's valid entries (bad ones are logged and skipped); a malformed file raises FileDiscoveryError."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise FileDiscoveryError(f"{source}: invalid YAML/JSON: {e}") from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict) or not isinstance(doc.get("endpoints", []), list):
        raise FileDiscoveryError(f"{source}: expected a mapping with an 'endpoints' list")
    out: list[Endpoint] = []
    seen: set[str] = set()
    for i, item in enumerate(doc.get("endpoints") or []):
        ep = _entry(item, f"{source}: endpoints[{i}]", check_address)
        if ep is None:
            continue
        if ep.name in seen:
            log.warning("%s: endpoints[%d]: duplicate name %r, skipped", source, i, ep.name)
            continue
        seen.add(ep.name)
        out.append(ep)
    return out


def _entry(e: Any, where: str, check_address: Callable[[str], str | None]) -> Endpoint | None:
    if not isinstance(e, dict):
        log.warning("%s: expected a mapping, skipped", where)
        return None
    name, address, port = e.get("name"), str(e.get("address", "")), e.get("port")
    if not isinstance(name, str) or not name:
        log.warning("%s: needs a name, skipped", where)
        return None
    problem = check_address(address)
    if problem is not None:
        log.warning("%s: address %r %s, skipped", where, address, problem)
        return None
    try:
        if isinstance(port, bool):
            raise ValueError
        p = int(str(port))
    except ValueError:
        p = 0
    if not 1 <= p <= 65535:
        log.warning("%s: port %r is not in 1-65535, skipped", where, port)
        return None
    labels = e.get("labels") or {}
    if not isinstance(labels, dict):
        log.warning("%s: labels must be a mapping, skipped", where)
        return None
    ns = e.get("namespace") or "default"
    return Endpoint(
        name=name, address=address, port=p, namespace=str(ns), labels={str(k): str(v) for k, v in labels.items()}
    )


class FileDiscovery(Plugin):
    type_name = "file-discovery"

    def __init__(self, name: str, path: str, watch: bool = False) -> None:
        super().__init__(name)
        self.path = path
        self.watch = watch

    @classmethod
    def from_config(cls, name: str, params: Params, context: PluginContext) -> Self:
        path = params.optional_str("path")
        if not path:
            raise params.fail("path", "required: the endpoints file")
        return cls(name, path, params.bool("watchFile", False))

    def _stamp(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def load(self) -> list[Endpoint]:
        try:
            size = os.path.getsize(self.path)
            if size > MAX_FILE_BYTES:
                raise FileDiscoveryError(f"{self.path}: {size} bytes, over the {MAX_FILE_BYTES}-byte limit")
            with open(self.path, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise FileDiscoveryError(f"{self.path}: cannot read the endpoints file: {e.strerror}") from None
        return parse_endpoints(text, self.path, self.check_address)

    @staticmethod
    def check_address(address: str) -> str | None:
        return ipv4_address(address)

    async def run(self, datastore: Datastore) -> None:
        """An EndpointSource: load (a bad file stops startup), then follow the file when watching."""
        stamp = self._stamp()
        datastore.replace_all(self.load())
        datastore.synced = True
        if not self.watch:
            await asyncio.Event().wait()
        while True:
            await asyncio.sleep(POLL_SECONDS)
            now = self._stamp()
            if now is None or now == stamp:
                continue
            stamp = now
            try:
                endpoints = self.load()
            except FileDiscoveryError as e:
                log.error("file-discovery %s: reload failed, keeping the current endpoints: %s", self.name, e)
                continue
            datastore.replace_all(endpoints)
            log.log(V(DEFAULT), "file-discovery %s: %d endpoints from %s", self.name, len(endpoints), self.path)
