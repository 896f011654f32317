"""End-to-end tests, the vLLM-compatible simulator, the demo and the benchmarks."""
