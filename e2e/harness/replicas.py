"""Active-active EPP replicas behind one Envoy: N `epp serve` processes with the same config, all in Envoy's
ext_proc cluster (Envoy round-robins the ext_proc streams, one per HTTP request, over them)."""

from __future__ import annotations

import urllib.request
from dataclasses import dataclass
from pathlib import Path

from e2e.harness.envoy_config import EnvoyOptions
from e2e.harness.http import metric_value
from e2e.harness.ports import free_ports
from e2e.harness.procs import EnvoyProcess, EppPorts, EppProcess


@dataclass
class ReplicatedStack:
    envoy: EnvoyProcess
    epps: list[EppProcess]
    workers: int = 1  # `epp serve --workers N` in each replica: worker i serves metrics on the metrics port + i

    @property
    def url(self) -> str:
        return self.envoy.url

    def picks(self) -> list[float]:
        """Each replica's successful scheduling attempts so far (its /metrics)."""
        ok = {"status": "success"}
        out = []
        for e in self.epps:
            for i in range(self.workers):
                url = f"http://127.0.0.1:{e.ports.metrics + i}/metrics"
                with urllib.request.urlopen(url, timeout=5) as r:
                    out.append(metric_value(r.read().decode(), "inference_extension_scheduler_attempts_total", ok, 0.0))
        return out

    def close(self) -> None:
        self.envoy.stop()
        for e in self.epps:
            e.stop()


def start_replicas(
    workdir: Path,
    config: str,
    replicas: int,
    *,
    log_level: str = "warning",
    ready_timeout: float = 60.0,
    serving: int | None = None,
    extra_args: list[str] | None = None,
    workers: int = 1,
) -> ReplicatedStack:
    """`serving` (default: all) of the replicas are in Envoy's cluster; the others run idle beside them.
    `extra_args` go to every `epp serve`; `workers` > 1 runs each as `epp serve --workers N`, and Envoy opens a
    connection per stream in flight so that the kernel spreads them over the workers (one HTTP/2 connection is one
    worker's)."""
    workdir.mkdir(parents=True, exist_ok=True)
    cfg = workdir / "epp-config.yaml"
    cfg.write_text(config)
    ports = free_ports(3 * replicas + 2)
    epps: list[EppProcess] = []
    envoy: EnvoyProcess | None = None
    try:
        for i in range(replicas):
            epps.append(
                EppProcess(
                    cfg,
                    workdir,
                    ports=EppPorts(*ports[3 * i : 3 * i + 3]),
                    log_level=log_level,
                    extra_args=[*(extra_args or []), *(["--workers", str(workers)] if workers > 1 else [])],
                )
            )
        opts = EnvoyOptions(
            listener_port=ports[-2],
            admin_port=ports[-1],
            ext_proc_port=epps[0].ports.grpc,
            extra_ext_proc_ports=[e.ports.grpc for e in epps[1 : serving or replicas]],
            ext_proc_streams_per_connection=1 if workers > 1 else None,
        )
        envoy = EnvoyProcess(opts, workdir)
        for e in epps:
            e.wait_ready(ready_timeout)
        envoy.wait_ready()
        return ReplicatedStack(envoy, epps, workers)
    except BaseException:
        if envoy is not None:
            envoy.stop()
        for e in epps:
            e.stop()
        raise
