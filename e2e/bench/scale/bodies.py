"""What large request bodies cost the EPP in memory, through real Envoy (issue 15, items 6/1-2).

Envoy (FULL_DUPLEX_STREAMED, as GIE) streams each chat body to the EPP, which gathers, parses and routes it, then
streams it back to Envoy for a sink model server (in this process: it reads and drops the body). For each body size
and concurrency the EPP's peak RSS (VmHWM, reset before each case through /proc/<pid>/clear_refs) and its settled RSS
(VmRSS a few seconds after the last answer) are read from /proc; "per body" is the peak growth over the idle RSS
divided by bytes in flight. The in-flight budget is raised so that every body of a case is admitted (the default
256 MiB refuses the third concurrent 120 MiB body with 503, which is the point of the budget, not what is measured).

    python -m e2e.bench.scale.bodies [--sizes 16,64,120] [--concurrency 1,4] [--config round-robin,approximate]
        [--refused 150]   # also a body over the 128 MiB limit, declared and chunked: peak and settled RSS
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import random
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

from aiohttp import web

from e2e.harness.backends import Backend
from e2e.harness.http import request
from e2e.harness.stack import start_stack

MiB = 1024 * 1024

CONFIGS = {
    "round-robin": "plugins: [{type: round-robin-picker}]\n"
    "schedulingProfiles: [{name: default, plugins: [{pluginRef: round-robin-picker}]}]\n",
    # GIE's default profile: the approximate prefix scorer hashes the prompt's characters.
    "approximate": "plugins: [{type: prefix-cache-scorer}, {type: kv-cache-utilization-scorer}, {type: queue-scorer}]\n"
    "schedulingProfiles: [{name: default, plugins: [{pluginRef: prefix-cache-scorer, weight: 3},"
    " {pluginRef: kv-cache-utilization-scorer, weight: 2}, {pluginRef: queue-scorer, weight: 2}]}]\n",
}


class Sink:
    """Model servers that read a body of any size, drop it, and answer a small completion."""

    def __init__(self, n: int) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="sink", daemon=True).start()
        self.backends = [
            Backend(f"sink-{i}", "127.0.0.1", asyncio.run_coroutine_threadsafe(self._serve(), self.loop).result(10))
            for i in range(n)
        ]

    async def _serve(self) -> int:
        async def handle(req: web.Request) -> web.Response:
            size = 0
            async for chunk in req.content.iter_chunked(1 << 20):
                size += len(chunk)
            usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
            return web.json_response({"id": "x", "model": "m", "choices": [], "usage": usage, "received": size})

        app = web.Application(client_max_size=1 << 40)
        app.router.add_route("*", "/{tail:.*}", handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        return int(runner.addresses[0][1])


def chat_body(size: int, seed: int) -> bytes:
    """A chat request of about `size` bytes: one user message of ASCII words."""
    rng = random.Random(seed)
    words = [rng.choice("abcdefghijklmnop") * rng.randint(2, 9) for _ in range(4096)]
    unit = " ".join(words)
    text = (unit * (size // len(unit) + 1))[: size - 120]
    return json.dumps({"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": 1}).encode()


def _status(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(rest.split()[0]) * 1024
    return out


def run_case(url: str, pid: int, bodies: list[bytes], settle: float) -> dict[str, float]:
    before = _status(pid)["VmRSS"]
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
    t0 = time.monotonic()
    with ThreadPoolExecutor(len(bodies)) as pool:
        futs = [
            pool.submit(
                request, url + "/v1/chat/completions", "POST", b, {"content-type": "application/json"}, timeout=300
            )
            for b in bodies
        ]
        results = [f.result() for f in futs]
    elapsed = time.monotonic() - t0
    peak = _status(pid)["VmHWM"]
    time.sleep(settle)
    settled = _status(pid)["VmRSS"]
    inflight = sum(len(b) for b in bodies)
    return {
        "statuses": sorted(r.status for r in results),  # type: ignore[dict-item]
        "seconds": round(elapsed, 2),
        "idle_mib": before / MiB,
        "peak_mib": peak / MiB,
        "settled_mib": settled / MiB,
        "peak_growth_per_body_byte": (peak - before) / inflight,
        "settled_growth_mib": (settled - before) / MiB,
    }


def _send_chunked(url: str, body: bytes) -> int:
    u = urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port or 80, timeout=300)
    try:
        pieces = (body[i : i + (1 << 20)] for i in range(0, len(body), 1 << 20))
        headers = {"content-type": "application/json"}
        conn.request("POST", "/v1/chat/completions", body=pieces, headers=headers, encode_chunked=True)
        r = conn.getresponse()
        r.read()
        return r.status
    except OSError:  # Envoy may reset once the EPP has refused the body
        return -1
    finally:
        conn.close()


def refused_cases(url: str, pid: int, cfg: str, size: int, settle: float) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    body = chat_body(size * MiB, 7)
    for how in ("declared", "chunked"):
        before = _status(pid)["VmRSS"]
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        if how == "declared":
            try:
                status = request(url + "/v1/chat/completions", "POST", body, {"content-type": "application/json"},
                                 timeout=300).status  # fmt: skip
            except OSError:
                status = -1
        else:
            status = _send_chunked(url, body)
        peak = _status(pid)["VmHWM"]
        time.sleep(settle)
        settled = _status(pid)["VmRSS"]
        row = {"config": cfg, "refused_mib": size, "how": how, "status": status, "idle_mib": before / MiB,
               "peak_mib": peak / MiB, "settled_mib": settled / MiB}  # fmt: skip
        print(f"{cfg:12} refused {size} MiB ({how}): status={status} idle={before / MiB:6.1f} "
              f"peak={peak / MiB:7.1f} settled={settled / MiB:6.1f} MiB", flush=True)  # fmt: skip
        out.append(row)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m e2e.bench.scale.bodies")
    p.add_argument("--sizes", default="16,64,120", help="body sizes in MiB")
    p.add_argument("--concurrency", default="1,4")
    p.add_argument("--config", default="round-robin,approximate")
    p.add_argument("--settle", type=float, default=3.0, help="seconds to wait before reading settled RSS")
    p.add_argument("--epp-args", default="", help="extra EPP flags (space separated)")
    p.add_argument(
        "--refused",
        type=int,
        default=0,
        help="also send one body of this many MiB (over the limit) "
        "with a content-length and one chunked, and read peak and settled RSS after each",
    )
    p.add_argument("--json", help="write the results here")
    ns = p.parse_args(argv)
    sizes = [int(s) for s in ns.sizes.split(",")]
    concurrency = [int(c) for c in ns.concurrency.split(",")]
    sink = Sink(2)
    rows: list[dict[str, object]] = []
    for cfg in ns.config.split(","):
        with tempfile.TemporaryDirectory(prefix="pyepp-bodies-") as tmp:
            endpoints = "endpoints:\n" + "".join(
                f"- {{name: {b.name}, address: {b.host}, port: {b.port}}}\n" for b in sink.backends
            )
            epp_args = ["--log-level", "warning", "--max-inflight-body-bytes", str(4 * 128 * MiB + MiB)]
            stack = start_stack(
                Path(tmp),
                backends=sink.backends,
                config=CONFIGS[cfg] + endpoints,
                epp_args=epp_args + ns.epp_args.split(),
            )
            try:
                pid = stack.epp.proc.pid
                request(stack.url + "/v1/chat/completions", "POST", chat_body(4096, 0),
                        {"content-type": "application/json"})  # fmt: skip
                for size in sizes:
                    for n in concurrency:
                        bodies = [chat_body(size * MiB, seed) for seed in range(n)]
                        r = run_case(stack.url, pid, bodies, ns.settle)
                        del bodies
                        row = {"config": cfg, "size_mib": size, "concurrent": n, **r}
                        rows.append(row)
                        print(
                            f"{cfg:12} {size:4} MiB x{n}: statuses={r['statuses']} {r['seconds']:6.2f}s "
                            f"idle={r['idle_mib']:6.1f} peak={r['peak_mib']:7.1f} settled={r['settled_mib']:6.1f} MiB "
                            f"peak growth/body byte={r['peak_growth_per_body_byte']:.2f}",
                            flush=True,
                        )
                if ns.refused:
                    rows.extend(refused_cases(stack.url, pid, cfg, ns.refused, ns.settle))
            finally:
                stack.close()
    if ns.json:
        Path(ns.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
