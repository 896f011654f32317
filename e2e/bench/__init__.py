"""Benchmarks: each prints ratios measured side by side in one run (results in docs/benchmarks.md)."""
