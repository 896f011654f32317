"""EPP configuration: the EndpointPickerConfig YAML (GIE/llm-d compatible) plus our extension keys."""

from epp.config.loader import ConfigError, EppConfig, StaticEndpointSpec, load_config, parse_config

__all__ = ["ConfigError", "EppConfig", "StaticEndpointSpec", "load_config", "parse_config"]
