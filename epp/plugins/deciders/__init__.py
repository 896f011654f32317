"""Disaggregation deciders: per request, whether a prefill (P/D) or encode (E/P/D) stage runs."""
