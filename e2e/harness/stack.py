"""A whole gateway on loopback: backends + `python -m epp serve` + Envoy, started and stopped together.

    stack = start_stack(workdir, backends=2, mode="FULL_DUPLEX_STREAMED", extra_config="modelRewrites: {a: b}")
    stack.url             # Envoy listener, e.g. http://127.0.0.1:PORT
    stack.backends        # [Backend(name, host, port)]
    stack.epp.metrics_url # the EPP's Prometheus endpoint
    stack.subset_urls     # {name: url of a listener that sends that subset hint}
    stack.close()

`config` may be the EPP config text, or a function of the backends returning it; by default every backend is
listed under `endpoints:` and `extra_config` (YAML) is appended.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from e2e.harness.backends import Backend, BackendPool
from e2e.harness.envoy_config import EnvoyOptions
from e2e.harness.external import ExternalEpp, ExternalEppProcess
from e2e.harness.ports import free_ports
from e2e.harness.procs import EnvoyProcess, EppPorts, EppProcess, StartError

log = logging.getLogger(__name__)

ConfigSpec = str | Callable[[list[Backend]], str] | None


def endpoints_yaml(backends: list[Backend]) -> str:
    """Static endpoints plus a round-robin profile, so protocol tests see a deterministic spread."""
    lines = [
        "plugins: [{type: round-robin-picker}]",
        "schedulingProfiles: [{name: default, plugins: [{pluginRef: round-robin-picker}]}]",
        "endpoints:",
    ]
    for b in backends:
        lines.append(f"  - {{name: {b.name}, address: {b.host}, port: {b.port}}}")
    return "\n".join(lines) + "\n"


@dataclass
class Stack:
    envoy: EnvoyProcess
    epp: EppProcess  # ours, or an ExternalEppProcess
    backends: list[Backend]
    pool: BackendPool | None
    subset_urls: dict[str, str] = field(default_factory=dict)
    events_endpoint: str = ""  # where the pods send their KV events to this EPP when they dial it (engine pools)

    @property
    def url(self) -> str:
        return self.envoy.url

    def backend_by_port(self, port: int) -> Backend:
        return next(b for b in self.backends if b.port == port)

    def close(self) -> None:
        """Stops every part even when stopping one fails (a failure must not leave the others running)."""
        try:
            self.envoy.stop()
        finally:
            try:
                self.epp.stop()
            finally:
                if self.pool is not None:
                    self.pool.close()


def start_stack(workdir: Path, attempts: int = 3, **kwargs: Any) -> Stack:
    """`_start_stack` with retries: a free port picked for a child can be taken before the child binds it."""
    for attempt in range(1, attempts + 1):
        try:
            return _start_stack(workdir, **kwargs)
        except StartError as e:
            if attempt == attempts:
                raise
            log.warning("stack start attempt %d failed, retrying: %s", attempt, e)
    raise AssertionError("unreachable")


def _start_stack(
    workdir: Path,
    backends: int | list[Backend] = 2,
    config: ConfigSpec = None,
    extra_config: str = "",
    mode: str = "FULL_DUPLEX_STREAMED",
    response_mode: str | None = None,
    subset_hints: dict[str, list[str]] | None = None,
    envoy_overrides: dict[str, object] | None = None,
    epp_args: list[str] | None = None,
    ready_timeout: float = 120.0,
    epp_source: Path | None = None,
    epp_log_level: str = "info",
    external: ExternalEpp | None = None,
    external_values: dict[str, object] | None = None,
) -> Stack:
    """Start backends (unless given), the EPP and Envoy; everything is torn down if any part fails to start.
    `ready_timeout` bounds the EPP's readiness wait (it returns as soon as the EPP is SERVING; on a loaded 2-core box
    an EPP start took 22-30 s here, so 30 s left the P/D and E/P/D fixtures no margin);
    `epp_source` runs the EPP of another checkout (A/B benchmarks); `external` runs another EPP from its command
    line instead of ours (`config` is then its config file, `external_values` fill its command's placeholders)."""
    pool: BackendPool | None = None
    if isinstance(backends, int):
        pool = BackendPool()
        bs = pool.start(backends)
    else:
        bs = list(backends)
    epp: EppProcess | None = None
    envoy: EnvoyProcess | None = None
    try:
        text = config(bs) if callable(config) else config
        if text is None:
            text = endpoints_yaml(bs) + extra_config
        cfg = workdir / "epp-config.yaml"
        n = 0
        while cfg.exists():
            n += 1
            cfg = workdir / f"epp-config-{n}.yaml"
        cfg.write_text(text)
        names = list((subset_hints or {}).keys())
        # All ports in one call, so none of them repeats before the children have bound theirs.
        picked = free_ports(3 + 2 + len(names))
        epp_ports, ports = picked[:3], picked[3:]
        if external is not None:
            epp = ExternalEppProcess(external, cfg, workdir, EppPorts(*epp_ports), external_values or {})
        else:
            epp = EppProcess(
                cfg, workdir, ports=EppPorts(*epp_ports), log_level=epp_log_level, extra_args=epp_args,
                source_tree=epp_source,
            )  # fmt: skip
        opts = EnvoyOptions(
            listener_port=ports[0],
            admin_port=ports[1],
            ext_proc_port=epp.ports.grpc,
            request_body_mode=mode,
            response_body_mode=response_mode,
            subset_listeners={ports[2 + i]: (subset_hints or {})[name] for i, name in enumerate(names)},
        )
        for k, v in (envoy_overrides or {}).items():
            setattr(opts, k, v)
        envoy = EnvoyProcess(opts, workdir)
        epp.wait_ready(ready_timeout)
        envoy.wait_ready()
        subset_urls = {name: f"http://127.0.0.1:{ports[2 + i]}" for i, name in enumerate(names)}
        return Stack(envoy=envoy, epp=epp, backends=bs, pool=pool, subset_urls=subset_urls)
    except BaseException:
        if envoy is not None:
            envoy.stop()
        if epp is not None:
            epp.stop()
        if pool is not None:
            pool.close()
        raise
