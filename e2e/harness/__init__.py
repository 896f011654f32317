"""Real-process test kit: Envoy + `python -m epp serve` + echo backends on loopback, for e2e tests and demos.

The whole gateway (what most tests want), via the pytest fixture `stack_factory` in e2e/conftest.py or directly:

    from e2e.harness.stack import start_stack
    stack = start_stack(workdir, backends=2, mode="FULL_DUPLEX_STREAMED",      # or "BUFFERED"
                        extra_config="modelRewrites: {a: b}\n",                 # appended to the generated endpoints
                        subset_hints={"pod1": ["127.0.0.1:PORT"]})              # listeners that send the hint
    stack.url, stack.backends, stack.subset_urls["pod1"], stack.epp.metrics_url, stack.envoy.admin_url
    stack.close()

`config=` replaces the generated EPP config (text, or a function of the backends). `envoy_overrides=` sets any
`EnvoyOptions` field. Pieces, usable alone:
- `ports.free_port()/free_ports(n)` — loopback ports; `ports.free_port_run(n)` — n consecutive ones;
- `envoy_config.EnvoyOptions` + `write_bootstrap(path, opts)` — typed (envoy-data-plane) Envoy bootstrap as JSON;
- `procs.EnvoyProcess(opts, workdir).wait_ready()` (admin /ready), `procs.EppProcess(config_path, workdir)
  .wait_ready()` (gRPC health `readiness` SERVING), `.stop()`, `.terminate()`, `.log_text()`, `.metrics_text()`;
- `backends.BackendPool().start(n)` — aiohttp echo backends on a background thread (JSON echo or SSE, with usage);
- `http.request/post_json/sse_events/metric_value` — blocking client helpers and a /metrics reader;
  `http.wire_request` reads a response off the socket to EOF and checks its framing (content-length, chunked).
"""
