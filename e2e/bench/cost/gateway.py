"""Through-Envoy throughput, side by side: Envoy alone (client sets the destination) vs Envoy + pyepp ext_proc.

Both Envoys (`--concurrency 1`) forward to the same aiohttp echo backend; wrk sends POST /v1/completions with a
1 KiB JSON body.
Alternates the two setups `--rounds` times and prints median req/s, p50/p99 and the ratio. Needs `wrk` (apt).
Run: `python -m e2e.bench.cost.gateway`.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path

from e2e.harness.backends import BackendPool
from e2e.harness.envoy_config import EnvoyOptions
from e2e.harness.ports import free_ports
from e2e.harness.procs import EnvoyProcess
from e2e.harness.stack import start_stack


def wrk(url: str, body: bytes, headers: dict[str, str], seconds: int, conns: int, workdir: Path) -> dict[str, float]:
    script = workdir / "post.lua"
    lines = ['wrk.method = "POST"', f"wrk.body = {json.dumps(body.decode())}"]
    lines += [f"wrk.headers[{json.dumps(k)}] = {json.dumps(v)}" for k, v in headers.items()]
    script.write_text("\n".join(lines) + "\n")
    argv = ["wrk", "-t1", f"-c{conns}", f"-d{seconds}s", "--latency", "-s", str(script), url]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 30).stdout

    def ms(label: str) -> float:
        m = re.search(rf"{label}%\s+([\d.]+)(us|ms|s)", out)
        if not m:
            return float("nan")
        v = float(m.group(1))
        return {"us": v / 1000, "ms": v, "s": v * 1000}[m.group(2)]

    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    return {
        "rps": float(rps.group(1)) if rps else float("nan"),
        "p50": ms("50"),
        "p99": ms("99"),
        "non2xx": float(non2xx.group(1)) if non2xx else 0.0,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--conns", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3, help="alternating runs per setup; medians are printed")
    args = ap.parse_args()
    if not shutil.which("wrk"):
        raise SystemExit("wrk not found (apt-get install wrk)")
    body = json.dumps({"model": "m", "prompt": "x" * 1000, "max_tokens": 8}).encode()
    with tempfile.TemporaryDirectory(prefix="pyepp-bench-") as tmp:
        work = Path(tmp)
        pool = BackendPool()
        backend = pool.start(1)[0]
        (work / "epp").mkdir()
        stack = start_stack(work / "epp", backends=[backend], epp_args=["--log-level", "warning"])
        p = free_ports(3)
        base = EnvoyProcess(EnvoyOptions(listener_port=p[0], admin_port=p[1], ext_proc_port=p[2], ext_proc=False), work)
        try:
            base.wait_ready()
            hdr = {"content-type": "application/json"}
            direct = {**hdr, "x-gateway-destination-endpoint": backend.hostport}
            runs: dict[str, list[dict[str, float]]] = {"envoy only": [], "envoy + pyepp": []}
            for _ in range(args.rounds):
                runs["envoy only"].append(
                    wrk(base.url + "/v1/completions", body, direct, args.seconds, args.conns, work)
                )
                runs["envoy + pyepp"].append(
                    wrk(stack.url + "/v1/completions", body, hdr, args.seconds, args.conns, work)
                )
            results = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()}
        finally:
            base.stop()
            stack.close()
            pool.close()
    print(f"wrk -t1 -c{args.conns} -d{args.seconds}s x {args.rounds} alternating rounds (medians), POST 1 KiB JSON")
    print(f"{'setup':16} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'non-2xx':>8}")
    for name, r in results.items():
        print(f"{name:16} {r['rps']:8.0f} {r['p50']:8.2f} {r['p99']:8.2f} {r['non2xx']:8.0f}")
    ratio = results["envoy + pyepp"]["rps"] / results["envoy only"]["rps"]
    print(f"throughput ratio (with EPP / without): {ratio:.2f}")


if __name__ == "__main__":
    main()
