"""pyepp: an Endpoint Picker for LLM inference behind Envoy ext_proc."""

__version__ = "0.1.0"
