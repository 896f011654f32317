"""The EPP's servers: Envoy ext_proc (gRPC), gRPC health, Prometheus /metrics, and their lifecycle."""
