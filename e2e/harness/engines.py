"""Another vLLM-compatible model server as the benchmarks' pool: pods started from a command line with placeholders
instead of `e2e.sim` (llm-d-inference-sim first; see `e2e/external/llm-d-inference-sim.yaml`).

    command: ${LLMD_SIM} --port {port} --model {model} --kv-cache-size {kv_blocks} --block-size {block_size}
             --zmq-endpoint {events_endpoint} ...
    env: {POD_NAME: "{name}", POD_IP: "{host}"}
    tokenizer: own      # the pods tokenize with their own tokenizer and serve it on /v1/completions/render
    cached_tokens: true # usage.prompt_tokens_details.cached_tokens per request
    events: connect     # the pods' KV-event PUB dials {events_endpoint}, which the EPP binds

A pool is started fresh for every run (`EnginePool.restart`): an engine may have no cache-reset endpoint and no
runtime KV-size change, and a restart gives each strategy empty caches and its own event endpoint.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import sys
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from e2e.harness.external import expand_env, fill
from e2e.harness.http import post_json
from e2e.harness.ports import free_ports
from e2e.harness.procs import StartError, _Process

ENGINE_KEYS = (
    "port", "host", "name", "model", "kv_blocks", "block_size", "events_endpoint", "max_num_seqs", "prefill_tps",
    "prefill_us_per_token", "prefill_overhead_ms", "inter_token_latency_ms", "time_factor_under_load", "seed", "python",
)  # fmt: skip
_KEYS = {"command", "env", "tokenizer", "cached_tokens", "events", "about"}


@dataclass(frozen=True)
class EngineSpec:
    name: str
    command: str
    env: dict[str, str] = field(default_factory=dict)
    tokenizer: str = "own"  # own: the pods' render API is the tokenizer | qwen: the bundled Qwen2.5, as e2e.sim
    cached_tokens: bool = True
    events: str = "connect"  # connect: pods dial {events_endpoint} | none: no KV events
    about: str = ""


def load_engine(path: Path) -> EngineSpec:
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ValueError(f"{path}: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("command"), str):
        raise ValueError(f"{path}: want a mapping with a command string")
    unknown = set(doc) - _KEYS
    if unknown:
        raise ValueError(f"{path}: unknown keys {', '.join(sorted(unknown))} (known: {', '.join(sorted(_KEYS))})")
    tokenizer, events = str(doc.get("tokenizer", "own")), str(doc.get("events", "connect"))
    if tokenizer not in ("own", "qwen"):
        raise ValueError(f"{path}: tokenizer must be own or qwen")
    if events not in ("connect", "none"):
        raise ValueError(f"{path}: events must be connect or none")
    env = doc.get("env") or {}
    if not isinstance(env, dict):
        raise ValueError(f"{path}: env must be a mapping")
    return EngineSpec(path.stem, doc["command"], {str(k): str(v) for k, v in env.items()}, tokenizer,
                      bool(doc.get("cached_tokens", True)), events, str(doc.get("about", "")))  # fmt: skip


@dataclass
class EnginePod:
    """One pod of an engine pool (the surface the benchmarks use of a SimProcess)."""

    name: str
    http_port: int
    host: str = "127.0.0.1"
    proc: _Process | None = None
    event_endpoint: str | None = None  # the pods dial the EPP: no endpoint of their own to list
    replay_endpoint: str | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.http_port}"

    @property
    def event_port(self) -> int | None:
        return None

    @property
    def replay_port(self) -> int | None:
        return None

    def wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and not self.proc.running():
                raise self.proc.fail("exited during start")
            with contextlib.suppress(OSError), urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
            time.sleep(0.05)
        raise StartError(f"{self.name} at {self.url} not healthy after {timeout}s")


class EnginePool(list[EnginePod]):
    """`n` pods of `spec` on fixed loopback ports (kept across restarts, so the EPPs' endpoint lists stay valid),
    plus one more outside the pool as the render server when the engine has its own tokenizer."""

    def __init__(self, spec: EngineSpec, n: int, values: Mapping[str, Any], workdir: Path) -> None:
        ports = free_ports(n + 1)
        super().__init__(EnginePod(f"{spec.name}-{i}", ports[i]) for i in range(n))
        self.spec, self.values, self.workdir = spec, dict(values), workdir
        self.kv_blocks = int(values["kv_blocks"])
        self.render = EnginePod(f"{spec.name}-render", ports[n]) if spec.tokenizer == "own" else None
        self.events_endpoint = ""

    @property
    def render_url(self) -> str:
        return self.render.url if self.render is not None else ""

    def _start(self, pod: EnginePod, seed: int, events_endpoint: str) -> None:
        values = {**self.values, "port": pod.http_port, "host": pod.host, "name": pod.name, "seed": seed,
                  "kv_blocks": self.kv_blocks, "events_endpoint": events_endpoint,
                  "python": sys.executable}  # fmt: skip
        argv = shlex.split(fill(expand_env(self.spec.command), values, ENGINE_KEYS))
        env = dict(os.environ, **{k: fill(expand_env(v), values, ENGINE_KEYS) for k, v in self.spec.env.items()})
        log = self.workdir / f"{pod.name}-{time.monotonic_ns()}.log"
        pod.proc = _Process(pod.name, argv, log, env=env)

    def restart(self, events_endpoint: str = "", timeout: float = 60.0) -> None:
        """Every pod stopped and started again: empty caches, this run's KV size and event endpoint (an unbound
        one when no EPP listens: the PUB dials it in vain)."""
        self.stop_pods()
        if not events_endpoint:
            events_endpoint = f"tcp://127.0.0.1:{free_ports(1)[0]}"
        self.events_endpoint = events_endpoint
        for i, pod in enumerate(self):
            self._start(pod, i, events_endpoint)
        if self.render is not None and (self.render.proc is None or not self.render.proc.running()):
            self._start(self.render, len(self), f"tcp://127.0.0.1:{free_ports(1)[0]}")
        for pod in [*self, *([self.render] if self.render is not None else [])]:
            pod.wait_healthy(timeout)

    def stop_pods(self) -> None:
        for pod in self:
            if pod.proc is not None:
                pod.proc.stop()
                pod.proc = None

    def close(self) -> None:
        self.stop_pods()
        if self.render is not None and self.render.proc is not None:
            self.render.proc.stop()
            self.render.proc = None


def render_ids(url: str, body: Mapping[str, Any], api: str, timeout: float = 30.0) -> list[int]:
    """The prompt's token ids as the engine's render API gives them (`/v1/completions/render` or the chat one)."""
    path = "/v1/chat/completions/render" if api == "chat" else "/v1/completions/render"
    keep = ("model", "messages", "tools", "chat_template_kwargs") if api == "chat" else ("model", "prompt")
    r = post_json(url + path, {k: v for k, v in body.items() if k in keep}, timeout=timeout)
    if r.status != 200:
        raise RuntimeError(f"POST {url}{path}: HTTP {r.status}: {r.body[:200]!r}")
    doc = json.loads(r.body)
    first = doc[0] if isinstance(doc, list) and doc else doc
    ids = first.get("token_ids") if isinstance(first, dict) else None
    if not isinstance(ids, list):
        raise RuntimeError(f"POST {url}{path}: no token_ids in {r.body[:200]!r}")
    return [int(x) for x in ids]
