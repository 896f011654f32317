"""Load the config file: GIE's EndpointPickerConfig plus `endpoints` (static discovery) and `modelRewrites`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A config problem, naming the offending key (and line when known)."""


@dataclass(slots=True)
class StaticEndpointSpec:
    address: str
    port: int
    labels: dict[str, str] = field(default_factory=dict)
    name: str | None = None
    metrics_port: int | None = None


@dataclass
class EppConfig:
    raw: dict[str, Any]
    endpoints: list[StaticEndpointSpec] = field(default_factory=list)
    # incoming model name -> target model name (applied unless the rewrite header is set)
    model_rewrites: dict[str, str] = field(default_factory=dict)
    source: str = "<text>"


def _endpoint(i: int, item: Any) -> StaticEndpointSpec:
    where = f"endpoints[{i}]"
    if not isinstance(item, dict):
        raise ConfigError(f"{where}: expected a mapping with address and port")
    try:
        address = str(item["address"])
        port = int(item["port"])
    except KeyError as e:
        raise ConfigError(f"{where}.{e.args[0]}: required") from None
    except (TypeError, ValueError):
        raise ConfigError(f"{where}.port: must be an integer, got {item.get('port')!r}") from None
    if not 0 < port < 65536:
        raise ConfigError(f"{where}.port: {port} is out of range")
    labels = item.get("labels") or {}
    if not isinstance(labels, dict):
        raise ConfigError(f"{where}.labels: expected a mapping")
    mp = item.get("metricsPort")
    return StaticEndpointSpec(
        address=address,
        port=port,
        labels={str(k): str(v) for k, v in labels.items()},
        name=item.get("name"),
        metrics_port=int(mp) if mp is not None else None,
    )


def parse_config(text: str, source: str = "<text>") -> EppConfig:
    try:
        raw = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{source}: invalid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: top level must be a mapping")
    eps = raw.get("endpoints") or []
    if not isinstance(eps, list):
        raise ConfigError(f"{source}: endpoints: expected a list")
    rewrites = raw.get("modelRewrites") or {}
    if not isinstance(rewrites, dict):
        raise ConfigError(f"{source}: modelRewrites: expected a mapping of model -> target")
    return EppConfig(
        raw=raw,
        endpoints=[_endpoint(i, e) for i, e in enumerate(eps)],
        model_rewrites={str(k): str(v) for k, v in rewrites.items()},
        source=source,
    )


def load_config(path: str | Path) -> EppConfig:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ConfigError(f"{p}: cannot read config: {e.strerror}") from None
    return parse_config(text, source=str(p))
