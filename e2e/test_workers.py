"""`epp serve --workers 2`: two EPP processes share the ext_proc and health ports (SO_REUSEPORT), see each other's
picks through the parent's relay, scrape and subscribe to each pod once between them (worker 0, through the
workers' feed), and a worker that dies is restarted."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from e2e.harness.envoy_config import EnvoyOptions
from e2e.harness.http import metric_value, post_json
from e2e.harness.ports import free_port_run, free_ports
from e2e.harness.procs import EnvoyProcess, EppPorts, EppProcess
from e2e.harness.simconfig import sim_endpoints_yaml
from e2e.sim.launch import SimProcess, start_simulators
from epp.server.workers import STARTUP_GRACE, worker_argv
from epp.tokenization.qwen import QWEN25_MODEL

pytestmark = pytest.mark.e2e


def _metrics(port: int, timeout: float = 60.0) -> str:
    """The page, once the worker serving it is up: each worker imports and starts on its own, and on a loaded
    2-core box the second can come up more than 10 s after the first is ready (a clean-clone CI run, 2026-12-04)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                return str(r.read().decode())
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_worker_argv_drops_workers_flag() -> None:
    argv = worker_argv(["serve", "--config", "c.yaml", "--workers", "3", "--workers=3", "--grpc-port", "1"], 2, "/s")
    assert argv[1:] == ["-m", "epp", "serve", "--config", "c.yaml", "--grpc-port", "1", "--worker-index", "2",
                        "--worker-state-socket", "/s"]  # fmt: skip
    argv = worker_argv(["serve"], 0, "/s", "ipc:///f")
    assert argv[-4:] == ["--worker-state-socket", "/s", "--worker-feed", "ipc:///f"]


def test_free_port_run_hands_out_disjoint_runs_below_the_ephemeral_range() -> None:
    """Consecutive ports for `--workers`' metrics: never inside the range outgoing connections take ports from,
    never the same run twice in a process (a bench starts many EPPs), and many more runs than one bench needs."""
    import socket

    from e2e.harness.ports import _ephemeral_low

    low, taken = _ephemeral_low(), set[int]()
    for _ in range(200):
        base = free_port_run(3)
        run = {base, base + 1, base + 2}
        assert max(run) < low and not taken & run
        taken |= run
    socks = [socket.socket() for _ in range(3)]
    try:
        for i, s in enumerate(socks):
            s.bind(("127.0.0.1", base + i))
    finally:
        for s in socks:
            s.close()


def test_two_workers_share_ports_and_each_serves_metrics(tmp_path: Path) -> None:
    cfg = tmp_path / "epp.yaml"
    # a light chain (no tokenizer to load in each worker): this is about the processes and their ports
    cfg.write_text("plugins: [{type: queue-scorer}]\nendpoints:\n- {address: 127.0.0.1, port: 9}\n")
    grpc_port, health = free_ports(2)
    metrics = free_port_run(2)  # worker i serves metrics on metrics + i: both must be free
    epp = EppProcess(cfg, tmp_path, EppPorts(grpc_port, health, metrics), extra_args=["--workers", "2"])
    try:
        epp.wait_ready()
        # worker i serves metrics on --metrics-port + i; both are whole EPPs with the pool in their datastore
        for port in (metrics, metrics + 1):
            assert 'inference_pool_ready_pods{name="default"}' in _metrics(port)
    finally:
        epp.stop()
    assert not epp.running()


DEST = "x-gateway-destination-endpoint"


def _headers() -> pb.ProcessingRequest:
    hs = {":path": "/v1/completions", ":method": "POST", ":authority": "gw", "content-type": "application/json"}
    return pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(
            headers=base_pb2.HeaderMap(
                headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in hs.items()]
            )
        ),
        protocol_config=pb.ProtocolConfiguration(
            request_body_mode=processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED,
            response_body_mode=processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED,
        ),
    )


async def _open_pick(port: int, prompt: str) -> tuple[grpc.aio.Channel, grpc.aio.StreamStreamCall, str]:
    """A request picked on a new connection (the kernel hands each connection to one worker), left in flight."""
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)])
    call = pb_grpc.ExternalProcessorStub(channel).Process()
    body = json.dumps({"model": "m", "prompt": prompt, "max_tokens": 4}).encode()
    await call.write(_headers())
    await call.write(pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True)))
    first = await asyncio.wait_for(call.read(), 20)
    assert first is not grpc.aio.EOF and first.HasField("request_headers"), first
    sets = first.request_headers.response.header_mutation.set_headers
    return channel, call, next(h.header.raw_value.decode() for h in sets if h.header.key == DEST)


def _picks(metrics: int, workers: int) -> list[float]:
    ok = {"status": "success"}
    return [
        metric_value(_metrics(metrics + i), "inference_extension_scheduler_attempts_total", ok, 0.0)
        for i in range(workers)
    ]


@pytest.mark.parametrize("sync", [True, False], ids=["shared", "local"])
def test_a_request_in_flight_in_one_worker_is_seen_by_the_other(tmp_path: Path, sync: bool) -> None:
    """One request held in flight through worker A; the next, landing on worker B, avoids its pod. Without the
    sharing (`syncCrossReplicaState: false`) B sees two idle pods and breaks the tie as A did: the same pod."""
    cfg = tmp_path / "epp.yaml"
    cfg.write_text(
        f"plugins: [{{type: inflight-load-producer, parameters: {{syncCrossReplicaState: {str(sync).lower()}}}}},"
        " {type: active-request-scorer}]\n"
        "schedulingProfiles: [{name: default, plugins: [{pluginRef: active-request-scorer}]}]\n"
        "endpoints:\n- {address: 127.0.0.1, port: 9}\n- {address: 127.0.0.2, port: 9}\n"
    )
    grpc_port, health = free_ports(2)
    metrics = free_port_run(2)
    epp = EppProcess(cfg, tmp_path, EppPorts(grpc_port, health, metrics), extra_args=["--workers", "2"])

    async def scenario() -> tuple[str, str]:
        held = await _open_pick(grpc_port, "first")
        first_worker = [i for i, n in enumerate(_picks(metrics, 2)) if n == 1]
        assert len(first_worker) == 1
        await asyncio.sleep(0.3)  # (the booking message takes well under a millisecond; the box may be loaded)
        for attempt in range(40):  # new connections until one lands on the other worker
            channel, call, dest = await _open_pick(grpc_port, f"next {attempt}")
            counts = _picks(metrics, 2)
            call.cancel()
            await channel.close()
            if counts[1 - first_worker[0]] >= 1:
                held[1].cancel()
                await held[0].close()
                return held[2], dest
            # that one landed on A and was cancelled: its release must reach B before B picks, or B sees both pods
            # busy and may break the tie onto A's held pod
            await asyncio.sleep(0.3)
        raise AssertionError("no connection landed on the other worker")

    try:
        epp.wait_ready()
        for port in (metrics, metrics + 1):
            _metrics(port)
        busy, other = asyncio.run(scenario())
        if sync:
            assert other != busy, (busy, other)
        else:
            assert other == busy, (busy, other)
    finally:
        epp.stop()


def _worker_pids(parent: int) -> list[int]:
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2 :].split()[1]) == parent:
                out.append(int(pid))
    return sorted(out)


def test_a_worker_that_dies_is_restarted_and_sigterm_stops_all(tmp_path: Path) -> None:
    cfg = tmp_path / "epp.yaml"
    cfg.write_text("plugins: [{type: queue-scorer}]\nendpoints:\n- {address: 127.0.0.1, port: 9}\n")
    grpc_port, health = free_ports(2)
    metrics = free_port_run(2)
    started = time.monotonic()
    epp = EppProcess(cfg, tmp_path, EppPorts(grpc_port, health, metrics), extra_args=["--workers", "2"])
    try:
        epp.wait_ready()
        _metrics(metrics + 1)
        time.sleep(max(0.0, started + STARTUP_GRACE + 0.5 - time.monotonic()))  # a crash now is restarted
        deadline = time.monotonic() + 30
        before = _worker_pids(epp.proc.pid)
        assert len(before) == 2, before
        os.kill(before[1], signal.SIGKILL)
        while True:
            now = _worker_pids(epp.proc.pid)
            if len(now) == 2 and before[1] not in now:
                break
            assert time.monotonic() < deadline, now
            time.sleep(0.1)
        assert "restarting it" in epp.log_text()
        for port in (metrics, metrics + 1):  # both serve again
            assert "inference_extension" in _metrics(port)
    finally:
        epp.stop()
    assert not epp.running() and _worker_pids(epp.proc.pid) == []


def _sim_state(sim: SimProcess) -> dict[str, Any]:
    with urllib.request.urlopen(sim.url + "/admin/state", timeout=5) as r:
        state: dict[str, Any] = json.loads(r.read())
    return state


def _worker_pid(parent: int, index: int) -> int:
    for pid in _worker_pids(parent):
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if argv[argv.index(b"--worker-index") + 1] == str(index).encode():
            return pid
    raise AssertionError(f"no worker {index}")


def _wait(what: str, cond: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_each_pod_is_scraped_and_subscribed_once_for_both_workers(tmp_path: Path) -> None:
    """`--workers 2` against two simulators, through Envoy: each pod's /metrics is fetched once per interval (not
    once per worker) and its KV-event publisher has one subscriber, yet both workers have fresh metrics and apply
    every KV event to their own index. Worker 0 killed: the other says the feed is gone and keeps routing; worker 0
    restarted: the feed is back, still one scrape and one subscription per pod."""
    interval = 0.1
    with start_simulators(
        2, base_args=["--block-size", "16", "--model", QWEN25_MODEL, "--kv-events-count-subscribers"]
    ) as sims:
        cfg = tmp_path / "epp.yaml"
        cfg.write_text(
            "plugins:\n"
            "- {type: precise-prefix-cache-scorer, parameters: {tokenProcessorConfig: {blockSize: 16, hashSeed: '7'},"
            " kvEventsConfig: {topicFilter: 'kv@'}}}\n"
            "- {type: queue-scorer}\n"
            "schedulingProfiles: [{name: default, plugins: [{pluginRef: precise-prefix-cache-scorer},"
            " {pluginRef: queue-scorer}]}]\n" + sim_endpoints_yaml(sims)
        )
        grpc_port, health, listener, admin = free_ports(4)
        metrics = free_port_run(2)
        started = time.monotonic()
        epp = EppProcess(
            cfg, tmp_path, EppPorts(grpc_port, health, metrics),
            extra_args=["--workers", "2", "--refresh-metrics-interval", f"{interval * 1000:g}ms"],
        )  # fmt: skip
        envoy = EnvoyProcess(
            EnvoyOptions(listener_port=listener, admin_port=admin, ext_proc_port=grpc_port,
                         ext_proc_streams_per_connection=1),
            tmp_path,
        )  # fmt: skip
        workers = (metrics, metrics + 1)

        def value(port: int, name: str, labels: dict[str, str] | None = None) -> float:
            return metric_value(_metrics(port), name, labels, 0.0)

        def fed() -> float:
            return value(metrics + 1, "pyepp_worker_feed_received_total", {"kind": "metrics", "outcome": "applied"})

        def scrape_rates(seconds: float = 3.0) -> list[float]:
            """GET /metrics per pod per interval, over `seconds`."""
            before, t0 = [_sim_state(s)["metrics_requests"] for s in sims], time.monotonic()
            time.sleep(seconds)
            after, t1 = [_sim_state(s)["metrics_requests"] for s in sims], time.monotonic()
            return [(b - a) * interval / (t1 - t0) for a, b in zip(before, after, strict=True)]

        try:
            epp.wait_ready(180)
            envoy.wait_ready()
            for port in workers:
                _metrics(port, 180)
            _wait("worker 1 fed", lambda: fed() > 0, 60)
            rates = scrape_rates()
            assert all(0.5 <= r <= 1.4 for r in rates), rates  # with each worker scraping: ~2
            assert [p["subscribers"] for s in sims for p in _sim_state(s)["publishers"]] == [1, 1]
            assert value(metrics, "kv_cache_events_active_subscribers") == 2
            assert value(metrics + 1, "kv_cache_events_active_subscribers") == 0
            for i in range(6):  # KV events from both pods (the prompts differ: queue-scorer spreads them)
                prompt = f"Request {i}: " + " ".join(f"word{i}-{j}" for j in range(120))
                r = post_json(envoy.url + "/v1/completions", {"model": QWEN25_MODEL, "prompt": prompt, "max_tokens": 2})
                assert r.status == 200, r.body

            def stored(port: int) -> float:
                return value(port, "kv_cache_events_blocks_total", {"op": "stored"})

            _wait(
                "both indexes hold the events", lambda: stored(metrics) > 0 and stored(metrics) == stored(metrics + 1)
            )
            # worker 0 dies: the other says so and keeps routing on its last state
            time.sleep(max(0.0, started + STARTUP_GRACE + 0.5 - time.monotonic()))
            os.kill(_worker_pid(epp.proc.pid, 0), signal.SIGKILL)
            _wait("feed gone said", lambda: "workers' feed: worker 0" in epp.log_text() and "is gone" in epp.log_text())
            assert value(metrics + 1, "pyepp_worker_feed_connected") == 0
            r = post_json(envoy.url + "/v1/completions", {"model": QWEN25_MODEL, "prompt": "still", "max_tokens": 2})
            assert r.status == 200, r.body
            # restarted: the feed is back, and still one scrape and one subscriber per pod
            _wait("worker 0 back", lambda: value(metrics + 1, "pyepp_worker_feed_connected") == 1, 180)
            _wait("worker 0 subscribed", lambda: value(metrics, "kv_cache_events_active_subscribers") == 2, 60)
            rates = scrape_rates()
            assert all(0.5 <= r <= 1.4 for r in rates), rates
            assert [p["subscribers"] for s in sims for p in _sim_state(s)["publishers"]] == [1, 1]
        finally:
            envoy.stop()
            epp.stop()
