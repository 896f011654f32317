"""--tracing without a collector exports nothing (one line says so); a collector that cannot be reached costs one
warning a minute, without a traceback."""

from __future__ import annotations

import logging

import pytest

from e2e.harness.ports import free_ports
from epp.server.tracing import EXPORT_LOGGERS, QUIET_SECONDS, ExportFailures, configured_endpoint, start_tracing


def test_no_collector_configured_no_tracing(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    for key in ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"):
        monkeypatch.delenv(key, raising=False)
    caplog.set_level(logging.INFO, logger="epp.server.tracing")
    assert start_tracing() is None
    assert [r.getMessage() for r in caplog.records] == [
        "tracing: no collector configured (OTEL_EXPORTER_OTLP_ENDPOINT); no spans are exported"
    ]
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317")
    assert configured_endpoint() == "http://collector:4317"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://traces:4317")
    assert configured_endpoint() == "http://traces:4317"  # the signal-specific one wins, as in the OTel SDK


def test_export_failures_are_one_warning_a_minute_without_traceback() -> None:
    now = [100.0]
    f = ExportFailures(clock=lambda: now[0])

    def record(level: int) -> logging.LogRecord:
        try:
            raise ConnectionError("refused")
        except ConnectionError as e:
            exc = (type(e), e, e.__traceback__)
        return logging.LogRecord("x", level, __file__, 1, "Failed to export %s", ("span",), exc)

    first = record(logging.ERROR)
    assert f.filter(first)
    assert first.levelno == logging.WARNING and first.exc_info is None
    assert first.getMessage() == "tracing: Failed to export span (ConnectionError: refused)"
    now[0] += QUIET_SECONDS - 1
    assert not f.filter(record(logging.ERROR)) and not f.filter(record(logging.WARNING))
    assert f.filter(record(logging.DEBUG))  # below warning: left to the level configured
    now[0] += 2
    assert f.filter(record(logging.ERROR))


def test_unreachable_collector_logs_no_traceback(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    (port,) = free_ports(1)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "1.0")
    caplog.set_level(logging.DEBUG)
    tracing = start_tracing()
    assert tracing is not None
    try:
        for _ in range(3):
            tracing.start_request({}).end()
            tracing.provider.force_flush(5_000)
    finally:
        tracing.shutdown()
        for name in EXPORT_LOGGERS:
            for f in [f for f in logging.getLogger(name).filters if isinstance(f, ExportFailures)]:
                logging.getLogger(name).removeFilter(f)
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("opentelemetry")]
    assert len(loud) == 1, [r.getMessage() for r in loud]
    assert loud[0].exc_info is None and loud[0].getMessage().startswith("tracing: ")
