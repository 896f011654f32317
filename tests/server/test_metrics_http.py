import aiohttp
from prometheus_client import CollectorRegistry, Counter

from epp.scheduling import metrics as sched_metrics
from epp.server.metrics_http import MetricsHTTP


async def test_metrics_endpoint_serves_request_and_global_registries() -> None:
    own = CollectorRegistry()
    Counter("pyepp_test_requests", "test counter", registry=own).inc(3)
    sched_metrics.SCHEDULER_ATTEMPTS.labels("success", "m", "p", "ns", "1").inc()
    http = MetricsHTTP(own, "127.0.0.1", 0)
    await http.start()
    try:
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{http.port}/metrics") as r:
            text = await r.text()
    finally:
        await http.stop()
    assert "pyepp_test_requests_total 3.0" in text
    assert 'inference_extension_scheduler_attempts_total{namespace="ns",pod_name="p"' in text
    assert "process_resident_memory_bytes" in text
