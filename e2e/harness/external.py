"""Another EPP, or another model server, as a command line with placeholders: the benchmarks run it where they run
ours (behind the same Envoy, on the same pods, with the same requests).

An external EPP is a YAML spec (see `e2e/external/`):

    command: ${MY_EPP} --config-file {config} --grpc-port {grpc_port} --grpc-health-port {health_port}
    config: |            # the EPP's config file, written per run
      plugins: [...]
      ... {endpoints_file} ... {block_size} ...

`$VAR` / `${VAR}` in the command come from the environment (an unset one is an error naming it); `{name}` is one of
`COMMAND_KEYS` in the command and one of `CONFIG_KEYS` in the config. Braces around any other text are left as
they are, so YAML flow maps need no escaping.
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from e2e.harness.procs import EppPorts, EppProcess, StartError, _Process
from e2e.harness.simconfig import Pod, pod_name

COMMAND_KEYS = ("config", "grpc_port", "health_port", "metrics_port", "endpoints_file", "workdir", "python")
CONFIG_KEYS = (
    "endpoints_file",  # llm-d's file-discovery endpoints file (written beside the config)
    "endpoints",  # pyepp's static `endpoints:` section (each pod labelled with its KV-event ports)
    "block_size",
    "prefill_tps",  # the engines' prefill throughput, tokens/s
    "model",
    "render_url",  # a server answering vLLM's /v1/completions/render with the pods' tokenizer
    "kv_events",  # a flow map for llm-d's kvEventsConfig reaching this pool's KV events
    "events_port",  # the pods' KV-event PUB port (the same on every pod), or the central SUB port
    "events_endpoint",  # where the pods' events arrive: tcp://127.0.0.1:PORT (the EPP binds it when pods dial)
)
_ENV = re.compile(r"\$(\w+)|\$\{(\w+)\}")


def fill(template: str, values: Mapping[str, object], keys: tuple[str, ...]) -> str:
    """`{key}` replaced by `values[key]` for every key of `keys`; other braces untouched."""
    pattern = re.compile(r"\{(" + "|".join(keys) + r")\}")

    def one(m: re.Match[str]) -> str:
        k = m.group(1)
        if k not in values:
            raise ValueError(f"placeholder {{{k}}} has no value here")
        return str(values[k])

    return pattern.sub(one, template)


def expand_env(text: str, env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env

    def one(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name not in env:
            raise ValueError(f"environment variable {name} is not set (the command {text!r} needs it)")
        return env[name]

    return _ENV.sub(one, text)


@dataclass(frozen=True)
class ExternalEpp:
    """An EPP started from a command line (`command`) with a config file from `config`."""

    name: str
    command: str
    config: str
    env: dict[str, str] = field(default_factory=dict)
    about: str = ""

    def argv(self, values: Mapping[str, object]) -> list[str]:
        return shlex.split(fill(expand_env(self.command), values, COMMAND_KEYS))

    def config_text(self, values: Mapping[str, object]) -> str:
        return fill(self.config, values, CONFIG_KEYS)


def load_external(name: str, path: Path) -> ExternalEpp:
    """The spec at `path` (keys: command, config, env, about); a missing or unknown key is an error naming it."""
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ValueError(f"{path}: {e}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: want a mapping with command and config")
    unknown = set(doc) - {"command", "config", "env", "about"}
    if unknown:
        raise ValueError(f"{path}: unknown keys {', '.join(sorted(unknown))} (known: command, config, env, about)")
    for k in ("command", "config"):
        if not isinstance(doc.get(k), str) or not doc[k].strip():
            raise ValueError(f"{path}: {k} must be a non-empty string")
    env = doc.get("env") or {}
    if not isinstance(env, dict):
        raise ValueError(f"{path}: env must be a mapping")
    return ExternalEpp(name, doc["command"], doc["config"], {str(k): str(v) for k, v in env.items()},
                       str(doc.get("about", "")))  # fmt: skip


def parse_external(items: str, base: Path | None = None) -> dict[str, ExternalEpp]:
    """`name=spec.yaml[,name=spec.yaml...]` (the --external flag) as specs by name."""
    out: dict[str, ExternalEpp] = {}
    for item in filter(None, (x.strip() for x in items.split(","))):
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--external {item!r}: want name=spec.yaml")
        p = Path(path)
        out[name] = load_external(name, p if p.is_absolute() or base is None else base / p)
    return out


def checked_externals(items: str) -> dict[str, ExternalEpp]:
    """`parse_external`, each spec checked (`check_spec`): the --external flag of the suite and the cost benches."""
    specs = parse_external(items)
    for spec in specs.values():
        check_spec(spec)
    return specs


class ExternalEppProcess(EppProcess):
    """An external EPP on free loopback ports; ready once its ext_proc port accepts connections (the first request
    through Envoy, retried, tells when it routes). Its metrics and health are where its command put them."""

    def __init__(self, spec: ExternalEpp, config_path: Path, workdir: Path, ports: EppPorts,
                 values: Mapping[str, object]) -> None:  # fmt: skip
        self.ports = ports
        argv = spec.argv(
            {**values, "config": config_path, "grpc_port": ports.grpc, "health_port": ports.health,
             "metrics_port": ports.metrics, "workdir": workdir, "python": sys.executable}
        )  # fmt: skip
        env = dict(os.environ, **{k: expand_env(v) for k, v in spec.env.items()})
        _Process.__init__(self, f"epp {spec.name}", argv, workdir / f"epp-{ports.grpc}.log", env=env)

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.running():
                raise self.fail("exited during start")
            try:
                with socket.create_connection(("127.0.0.1", self.ports.grpc), timeout=1):
                    return
            except OSError:
                time.sleep(0.1)
        raise self.fail("not listening in time")


def file_discovery_yaml(pods: list[tuple[str, str, int]]) -> str:
    """llm-d's file-discovery endpoints file: (name, address, port) per pod."""
    lines = ["endpoints:"]
    for name, address, port in pods:
        lines += [f"- name: {name}", f'  address: "{address}"', f'  port: "{port}"']
    return "\n".join(lines) + "\n"


def pool_values(
    pods: Sequence[Pod], workdir: Path, *, endpoints: str, block_size: int, prefill_tps: float, model: str,
    render_url: str, events_endpoint: str = "",
) -> dict[str, object]:  # fmt: skip
    """What an external EPP's config placeholders (`CONFIG_KEYS`) stand for over `pods`; writes the file-discovery
    endpoints file into `workdir`. `endpoints` is pyepp's static `endpoints:` section over them; `events_endpoint`
    is where the pods send their events when they dial the EPP (an engine pool), else the EPP finds each pod's by
    pod discovery (one event port shared by all pods) or finds none."""
    endpoints_file = workdir / "endpoints.yaml"
    endpoints_file.write_text(file_discovery_yaml([(pod_name(p), p.host, p.http_port) for p in pods]))
    ports = {p.event_port for p in pods}
    events_port: int | None = next(iter(ports)) if len(ports) == 1 else None
    if events_endpoint:
        events_port = int(events_endpoint.rpartition(":")[2])
        kv_events = f'{{topicFilter: "kv@", concurrency: 8, discoverPods: false, zmqEndpoint: "{events_endpoint}"}}'
    elif events_port is not None:
        discovery = f"podDiscoveryConfig: {{socketPort: {events_port}}}"
        kv_events = f'{{topicFilter: "kv@", concurrency: 8, discoverPods: true, {discovery}}}'
    else:
        kv_events = '{topicFilter: "kv@", discoverPods: false}'
    return {
        "endpoints_file": endpoints_file, "endpoints": endpoints, "block_size": block_size,
        "prefill_tps": prefill_tps, "model": model, "render_url": render_url, "kv_events": kv_events,
        "events_port": events_port if events_port is not None else "", "events_endpoint": events_endpoint,
    }  # fmt: skip


def check_spec(spec: ExternalEpp) -> None:
    """Fails early (before any pod starts) on a spec whose command cannot be built here."""
    values: dict[str, object] = {k: 0 for k in COMMAND_KEYS} | {"python": sys.executable}
    argv = spec.argv(values)
    if not argv:
        raise ValueError(f"external EPP {spec.name}: empty command")
    exe = argv[0]
    if os.sep in exe and not os.access(exe, os.X_OK):
        raise StartError(f"external EPP {spec.name}: {exe} is not an executable file")
