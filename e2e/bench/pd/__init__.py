"""Prefill/decode disaggregation: 2P+2D against 4 aggregated, and the sidecar path alone."""
