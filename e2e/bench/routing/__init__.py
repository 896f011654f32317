"""Routing quality: the workload suite, its report and the per-request affinity trace."""
