"""Max picks/s of the EPP on this box, one process vs `--workers N` (SO_REUSEPORT), with the full chain.

The load comes from h2load (nghttp2, C) speaking gRPC straight to the EPP's ext_proc port: each HTTP/2
stream is one `Process` call carrying what Envoy sends for one request (request_headers, then the JSON
body with end_of_stream), so a stream is one pick and the EPP answers with the header mutation and the
streamed body. Envoy is left out on purpose: the point is the EPP's own ceiling. The EPP scores 4 real
simulators (metrics scraped, KV events subscribed) with the given strategy.

    python -m e2e.bench.cost.picks --workers 1,2 --strategy precise --streams 20000
    python -m e2e.bench.cost.picks --workers 1 --strategy precise --streams 8000 --repeats 3 \
        --sources old@/tmp/tree-64f7a9f,new@/tmp/tree-daba74d     # an A/B of two checkouts' EPPs, alternated
        --sources 'default,si=--gil-switch-interval 500us'          # this checkout with and without a flag
        --sources 'default,floor'                                    # beside the Python floor (below)
        --sources 'default,floor' --pythons 'venv,image=.venv-image/bin/python'  # and under the image's interpreter
    LLMD_EPP=/path/to/epp python -m e2e.bench.cost.picks --workers 1 --strategy llm-d-default,pyepp-default \
        --external llm-d-default=e2e/external/llm-d-default.yaml --sources 'default,floor'  # another EPP beside ours

With `--sources` every run uses the same simulators and the same frames; each checkout's EPP serves in turn
(`python -m epp` from that checkout), `--repeats` times, and the medians are compared. The source named `floor` is
`e2e/bench/cost/floor.py` instead of an EPP: a minimal grpc.aio ext_proc server answering every stream with a
fixed destination, i.e. what the same h2load load costs any Python ext_proc server (transport and protobuf only).

`--external NAME=SPEC.yaml` makes strategy NAME another EPP started from the spec's command line
(`e2e.harness.external`; specs in `e2e/external/`) on the same simulators and frames, its CPU read from /proc like
ours (the process and its children). It runs once per repeat: sources, `--workers` and `--pythons` are pyepp's. Its
picks are counted from the same metric (llm-d's EPP exports it too); it starts measuring once a stream is answered
with a destination.

`--pythons` runs every source (the floor too) under each named interpreter in turn, alternated like the sources: a
bare name is the one running this benchmark, `name=PATH` another with the project's dependencies installed. The
interpreter matters here: the image runs Debian's python3.11, which served 4–21% more picks/s than a
pyenv build without PGO (2026-12-06, docs/benchmarks.md); `make image-python-venv` makes `.venv-image` from it.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from e2e.bench.procstat import cpu_seconds
from e2e.harness.external import ExternalEpp, ExternalEppProcess, checked_externals, pool_values
from e2e.harness.http import metric_value, request
from e2e.harness.ports import free_port_run, free_ports
from e2e.harness.procs import EppPorts, EppProcess
from e2e.sim.launch import SimProcess, start_simulators
from e2e.strategies import config_text, endpoints_yaml
from e2e.workloads.text import TextFactory

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
DEST = "x-gateway-destination-endpoint"


def request_messages(body: bytes, path: str = "/v1/completions") -> list[pb.ProcessingRequest]:
    """The two ProcessingRequest messages Envoy sends for one request: its headers, then its whole body."""
    hdrs = base_pb2.HeaderMap(
        headers=[
            base_pb2.HeaderValue(key=":method", raw_value=b"POST"),
            base_pb2.HeaderValue(key=":path", raw_value=path.encode()),
            base_pb2.HeaderValue(key=":authority", raw_value=b"gateway"),
            base_pb2.HeaderValue(key="content-type", raw_value=b"application/json"),
            base_pb2.HeaderValue(key="content-length", raw_value=str(len(body)).encode()),
        ]
    )
    return [
        pb.ProcessingRequest(request_headers=pb.HttpHeaders(headers=hdrs, end_of_stream=False)),
        pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True)),
    ]


def grpc_frames(body: bytes, path: str = "/v1/completions") -> bytes:
    """`request_messages`, each with gRPC's 5-byte length prefix (h2load's request body)."""
    out = b""
    for m in request_messages(body, path):
        data = m.SerializeToString()
        out += b"\x00" + len(data).to_bytes(4, "big") + data
    return out


def h2load(port: int, frames: Path, streams: int, clients: int, per_client: int) -> dict[str, float]:
    log_file = frames.with_suffix(".log")
    log_file.unlink(missing_ok=True)
    cmd = [
        "h2load", "-n", str(streams), "-c", str(clients), "-m", str(per_client), "-d", str(frames),
        f"--log-file={log_file}",
        "-H", "content-type: application/grpc", "-H", "te: trailers",
        f"http://127.0.0.1:{port}/envoy.service.ext_proc.v3.ExternalProcessor/Process",
    ]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600).stdout
    m = re.search(r"finished in ([\d.]+)(ms|s), ([\d.]+) req/s", out)
    ok = re.search(r"requests: \d+ total, \d+ started, \d+ done, (\d+) succeeded, (\d+) failed", out)
    lat = re.search(r"time for request:\s+([\d.]+)(us|ms|s)\s+([\d.]+)(us|ms|s)\s+([\d.]+)(us|ms|s)", out)
    if not m or not ok:
        raise RuntimeError(f"unexpected h2load output:\n{out}")

    def ms(v: str, unit: str) -> float:
        return float(v) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]

    seconds = float(m.group(1)) / (1000 if m.group(2) == "ms" else 1)
    res = {"seconds": seconds, "picks_per_s": float(m.group(3)), "succeeded": float(ok.group(1)),
           "failed": float(ok.group(2))}  # fmt: skip
    if lat:
        res["mean_ms"] = ms(lat.group(5), lat.group(6))
        res["max_ms"] = ms(lat.group(3), lat.group(4))
    # Per-stream latency (h2load's log: start µs, status, µs to the end of the response): the pick as a client sees
    # it, queueing behind the other streams in flight included.
    us = sorted(int(line.split("\t")[2]) for line in log_file.read_text().splitlines() if line.count("\t") >= 2)
    if us:
        res["p50_ms"] = us[len(us) // 2] / 1e3
        res["p99_ms"] = us[min(len(us) - 1, int(len(us) * 0.99))] / 1e3
    return res


def counted_picks(metrics_port: int, workers: int) -> float:
    """Successful scheduling attempts summed over the workers' /metrics (worker i serves port + i)."""
    name, ok = "inference_extension_scheduler_attempts_total", {"status": "success"}
    return sum(
        metric_value(request(f"http://127.0.0.1:{metrics_port + i}/metrics").body.decode(), name, ok, default=0.0)
        for i in range(workers)
    )


def _has_kit_flags(tree: Path) -> bool:
    """Older checkouts predate the anchors' flags (TLS and metrics auth on by default, --tracing): they serve
    plaintext without them and refuse `--secure-serving=false`."""
    out = subprocess.run(
        [sys.executable, "-m", "epp", "serve", "--help"], cwd=tree, capture_output=True, text=True, timeout=120
    )
    return "--tracing" in out.stdout


FLOOR = "floor"


def wait_picking(port: int, body: bytes, within: float = 60.0) -> None:
    """Returns once a stream sent to the ext_proc server on `port` is answered with a destination: an external EPP
    may listen before it has found its pods."""
    deadline = time.monotonic() + within
    last = "no answer"
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.ExternalProcessorStub(channel)
        while True:
            try:
                for resp in stub.Process(iter(request_messages(body)), timeout=10):
                    kind = resp.WhichOneof("response")
                    if kind in ("request_headers", "request_body"):
                        mutation = getattr(resp, kind).response.header_mutation
                        if any(h.header.key == DEST for h in mutation.set_headers):
                            return
                    last = f"answered {kind} without a destination"
            except grpc.RpcError as e:
                last = f"{e.code()}: {e.details()}"
            if time.monotonic() > deadline:
                raise RuntimeError(f"the EPP on port {port} picked nothing within {within:.0f} s ({last})")
            time.sleep(0.5)


def _warm(sims: Sequence[Any], run: int) -> None:
    """One request per simulator, salted per run so that its blocks are new to the engine: each publishes a
    BlockStored the running EPP ingests, which makes its endpoints publishers (the precise index, not the
    approximate fallback, then matches them; the bench prompt itself stays uncached, a miss)."""
    warm = json.dumps({"model": "Qwen/Qwen2.5-0.5B-Instruct", "prompt": "warm " * 64, "max_tokens": 1,
                       "cache_salt": f"picks-{run}"}).encode()  # fmt: skip
    for sim in sims:
        request(f"http://127.0.0.1:{sim.http_port}/v1/completions", "POST", warm,
                {"content-type": "application/json"}, timeout=120)  # fmt: skip
    time.sleep(0.5)  # the events' way to the EPP


def parse_pythons(spec: str) -> list[tuple[str, str | None]]:
    """`--pythons`: [(name, interpreter)], None for this one. Each interpreter must run and import the EPP's
    dependencies, so that a typo fails here, not as an EPP that never became ready."""
    if not spec:
        return [("", None)]
    out: list[tuple[str, str | None]] = []
    for item in spec.split(","):
        name, eq, path = item.partition("=")
        if not name or name in (n for n, _ in out):
            raise SystemExit(f"--pythons {item!r}: every interpreter needs a name of its own")
        if eq and not path:
            raise SystemExit(f"--pythons {item!r}: no interpreter after '='")
        if path:
            try:
                done = subprocess.run([path, "-c", "import grpc, msgspec, uvloop, zmq"], capture_output=True,
                                      text=True, timeout=120)  # fmt: skip
            except OSError as e:
                raise SystemExit(f"--pythons {item!r}: cannot run {path}: {e}") from None
            if done.returncode != 0:
                last = (done.stderr.strip().splitlines() or ["?"])[-1]
                raise SystemExit(f"--pythons {item!r}: {path} lacks the EPP's dependencies ({last})")
        out.append((name, path or None))
    return out


def _floor_run(tmp: Path, frames: Path, ns: argparse.Namespace, python: str | None = None) -> dict[str, float]:
    """The same h2load run against the Python floor (fixed destination): the transport's own ceiling."""
    from e2e.bench.cost.breakdown import FloorProcess

    floor = FloorProcess(tmp, "127.0.0.1:8000", python=python)
    try:
        floor.wait_ready()
        h2load(floor.port, frames, min(2000, ns.streams), ns.clients, ns.per_client)  # warm up
        cpu0 = cpu_seconds(floor.proc.pid)
        res = h2load(floor.port, frames, ns.streams, ns.clients, ns.per_client)
        res["cpu_us_per_pick"] = (cpu_seconds(floor.proc.pid) - cpu0) / ns.streams * 1e6
        res["picks_counted"] = res["succeeded"]
    finally:
        floor.stop()
    return res


def _measure(pid: int, grpc_port: int, metrics: int, workers: int, frames: Path, ns: argparse.Namespace
             ) -> dict[str, float]:  # fmt: skip
    """A warm-up, then the h2load run; the EPP's CPU per pick (the process and its children: every worker's and the
    parent's) and the picks its metrics counted."""
    h2load(grpc_port, frames, min(2000, ns.streams), ns.clients, ns.per_client)  # warm up
    before = counted_picks(metrics, workers)
    cpu0 = cpu_seconds(pid, children=True)
    res = h2load(grpc_port, frames, ns.streams, ns.clients, ns.per_client)
    # what a loaded box does not inflate
    res["cpu_us_per_pick"] = (cpu_seconds(pid, children=True) - cpu0) / ns.streams * 1e6
    res["picks_counted"] = counted_picks(metrics, workers) - before
    return res


def _external_run(spec: ExternalEpp, sims: Sequence[SimProcess], workdir: Path, frames: Path, body: bytes,
                  ns: argparse.Namespace) -> dict[str, float]:  # fmt: skip
    """The same h2load run against another EPP from its spec, its config filled over the same simulators."""
    workdir.mkdir(parents=True)
    values = pool_values(sims, workdir, endpoints=endpoints_yaml(sims), block_size=16, prefill_tps=15928.0,
                         model=MODEL, render_url=sims[0].url)  # fmt: skip
    cfg = workdir / "epp-config.yaml"
    cfg.write_text(spec.config_text(values))
    ports = EppPorts(*free_ports(3))
    epp = ExternalEppProcess(spec, cfg, workdir, ports, values)
    try:
        epp.wait_ready(120)
        wait_picking(ports.grpc, body)
        time.sleep(1.0)  # scraping
        return _measure(epp.proc.pid, ports.grpc, ports.metrics, 1, frames, ns)
    finally:
        epp.stop()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m e2e.bench.cost.picks")
    p.add_argument("--workers", default="1,2")
    p.add_argument("--strategy", default="precise", help="one or more (comma-separated, alternated)")
    p.add_argument("--streams", type=int, default=20000)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--per-client", type=int, default=8, help="concurrent streams per connection")
    p.add_argument("--prompt-tokens", type=int, default=1024)
    p.add_argument(
        "--sources",
        default="",
        help="name[@checkout][=flags],...: A/B the EPPs of these checkouts (this one without @), with these "
        "`epp serve` flags (alternated)",
    )
    p.add_argument(
        "--pythons",
        default="",
        help="name[=interpreter],...: run every source under each of these interpreters (a bare name: this one)",
    )
    p.add_argument("--repeats", type=int, default=1, help="runs per worker count (and source), alternated")
    p.add_argument(
        "--warm-sims",
        action="store_true",
        help="before each run, one request to every simulator: their KV events reach the EPP (a pool whose engines "
        "publish), instead of a cold one where pyepp-default's approximateFallback matches every pick",
    )
    p.add_argument(
        "--external",
        default="",
        help="name=spec.yaml,...: strategy <name> is another EPP run from the spec's command line (e2e/external/)",
    )
    p.add_argument("--json", help="write results here")
    ns = p.parse_args(argv)
    try:
        externals = checked_externals(ns.external)
    except (ValueError, OSError) as e:
        p.error(str(e))
    sources: list[tuple[str, Path | None, list[str]]] = [("", None, [])]
    if ns.sources:
        sources = []
        for item in ns.sources.split(","):
            head, _, flags = item.partition("=")
            name, _, tree = head.partition("@")
            if name == FLOOR and (tree or flags):
                raise SystemExit(f"--sources {item!r}: the floor takes no checkout or flags")
            if tree and not (Path(tree) / "epp" / "__init__.py").exists():
                raise SystemExit(f"--sources {item!r}: {tree} holds no epp package")
            sources.append((name, Path(tree) if tree else None, flags.split()))
    pythons = parse_pythons(ns.pythons)
    if shutil.which("h2load") is None:
        raise SystemExit("h2load not found: apt-get install nghttp2-client")
    prompt = TextFactory(5).text("picks", ns.prompt_tokens)
    body = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 16}).encode()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="pyepp-picks-") as tmp, start_simulators(4) as sims:
        frames = Path(tmp) / "frames.bin"
        frames.write_bytes(grpc_frames(body))
        strategies = ns.strategy.split(",")
        cfgs = {}
        for strategy in strategies:
            if strategy not in externals:
                cfgs[strategy] = Path(tmp) / f"epp-{strategy}.yaml"
                cfgs[strategy].write_text(config_text(strategy, sims))
        runs = [
            (w, strategy, src, py)
            for w in (int(x) for x in ns.workers.split(","))
            for _ in range(ns.repeats)
            for strategy in strategies
            for src in sources
            for py in pythons
        ]
        # The floor once per round (with the first strategy); another EPP once per round: one process, this
        # interpreter, with the first EPP source (or the floor when there is none).
        anchor = next((src for src in sources if src[0] != FLOOR), sources[0])
        for w, strategy, (src_name, tree, flags), (py_name, python) in runs:
            if strategy in externals:
                if w == 1 and (src_name, tree, flags) == anchor and python == pythons[0][1]:
                    res = _external_run(externals[strategy], sims, Path(tmp) / f"ext-{len(rows)}", frames, body, ns)
                    rows.append({**res, "workers": 1, "source": "", "strategy": strategy, "python": ""})
                    print(f"{strategy}: {res['picks_per_s']:.0f} picks/s ({res['succeeded']:.0f} ok, "
                          f"{res['failed']:.0f} failed; p50 {res.get('p50_ms', float('nan')):.1f} ms, p99 "
                          f"{res.get('p99_ms', float('nan')):.1f} ms; EPP counted {res['picks_counted']:.0f} picks; "
                          f"EPP CPU {res['cpu_us_per_pick']:.0f} µs/pick)", flush=True)  # fmt: skip
                if src_name != FLOOR:
                    continue
            if src_name == FLOOR:
                if w != 1 or strategy != strategies[0]:
                    continue
                res = _floor_run(Path(tmp), frames, ns, python)
                label = f"{FLOOR} {py_name}".strip()
                rows.append({**res, "workers": 1, "source": label, "strategy": "", "python": python or sys.executable})
                print(f"{label}: {res['picks_per_s']:.0f} picks/s ({res['failed']:.0f} failed; p50 "
                      f"{res.get('p50_ms', float('nan')):.1f} ms, p99 {res.get('p99_ms', float('nan')):.1f} ms; "
                      f"CPU {res['cpu_us_per_pick']:.0f} µs/pick)", flush=True)  # fmt: skip
                continue
            cfg = cfgs[strategy]
            grpc_port, health = free_ports(2)
            metrics = free_port_run(w)  # worker i serves metrics on metrics + i
            epp = EppProcess(cfg, Path(tmp), EppPorts(grpc_port, health, metrics), log_level="warning",
                             extra_args=["--workers", str(w), *flags], source_tree=tree, python=python,
                             kit_defaults=tree is None or _has_kit_flags(tree))  # fmt: skip
            try:
                epp.wait_ready(120)
                time.sleep(1.0 + w)  # every worker up, subscribed and scraping
                if ns.warm_sims:
                    _warm(sims, len(rows))
                res = _measure(epp.proc.pid, grpc_port, metrics, w, frames, ns)
            finally:
                epp.stop()
            src_label = f"{src_name} {py_name}".strip()
            row: dict[str, Any] = {**res, "workers": w, "source": src_label, "strategy": strategy,
                                   "python": python or sys.executable}  # fmt: skip
            rows.append(row)
            mean, p50, p99 = (res.get(k, float("nan")) for k in ("mean_ms", "p50_ms", "p99_ms"))
            tag = f"{strategy} {src_label + ' ' if src_label else ''}"
            print(f"{tag}workers={w}: {res['picks_per_s']:.0f} picks/s ({res['succeeded']:.0f} ok, {res['failed']:.0f} "
                  f"failed; latency mean {mean:.1f} ms, p50 {p50:.1f} ms, p99 {p99:.1f} ms at "
                  f"{ns.clients * ns.per_client} in flight; EPP counted {res['picks_counted']:.0f} picks; "
                  f"EPP CPU {res.get('cpu_us_per_pick', float('nan')):.0f} µs/pick)",
                  flush=True)  # fmt: skip
    med = statistics.median
    groups: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((f"{r['strategy']} {r['source']}".strip(), float(r["workers"])), []).append(r)
    nan = float("nan")
    summary = {
        k: tuple(med(float(r.get(f, nan)) for r in g) for f in ("picks_per_s", "p99_ms", "cpu_us_per_pick"))
        for k, g in groups.items()
    }
    (src0, w0), (base, _, cpu_base) = next(iter(summary.items()))
    base = base or 1.0
    for (src, wk), (pps, p99, cpu) in summary.items():
        label = f"{src + ' ' if src else ''}workers={wk:.0f}"
        print(f"{label}: median {pps:.0f} picks/s, p99 {p99:.1f} ms, EPP CPU {cpu:.0f} µs/pick over "
              f"{len(groups[(src, wk)])} runs; {pps / base:.2f}x the picks/s and {cpu / cpu_base:.2f}x the CPU "
              f"of {src0 + ' ' if src0 else ''}workers={w0:.0f}")  # fmt: skip
    if ns.json:
        Path(ns.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
