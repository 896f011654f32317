"""What the data layer costs: CPU per scrape (GET + extract) and the partial parser vs a full parse.

Serves a realistic vLLM /metrics page (~all of vLLM's families, with histograms) from a local aiohttp server and
scrapes N endpoints at the default 50 ms interval for a few seconds, measuring this process's CPU time. Then the
GET alone, client side only (the page served by a child process): aiohttp's ClientSession vs the scraper's
kept-alive `KeepAliveGet`, alternated, CPU µs per GET.

    python -m e2e.bench.components.scraper [--endpoints 16] [--seconds 3]

`--loop` measures the scrape loop as the EPP runs it, on the simulators' small page (`--page sim`, the benchmarks'
case: 4 pods at 50 ms) or the vLLM-sized one: main-thread CPU µs per scrape of a process that does nothing else,
the pages served by a child process (`--changing`: a counter on the page moves every GET). `--sources
name@checkout,...` runs each checkout's scraper in its own process, alternated, for an A/B of two commits:

    python -m e2e.bench.components.scraper --loop --endpoints 4 --seconds 5 --rounds 3 --sources main@/tmp/main,new@.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from aiohttp import web

from e2e.harness.aioserve import serve_app
from epp.datalayer.datastore import Datastore
from epp.datalayer.extractor import CoreMetricsExtractor
from epp.datalayer.httpget import KeepAliveGet
from epp.datalayer.scraper import MetricsScraper
from epp.framework import Endpoint


def big_vllm_page() -> str:
    """~vLLM v0.x page size: gauges we read, plus many counters and histograms we skip."""
    lines = [
        'vllm:num_requests_running{engine="0",model_name="m"} 3.0',
        'vllm:num_requests_waiting{engine="0",model_name="m"} 2.0',
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.42',
        'vllm:lora_requests_info{max_lora="1",running_lora_adapters="",waiting_lora_adapters=""} 1.7e9',
        'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="4096"} 1.0',
    ]
    for h in range(24):
        name = f"vllm:histogram_{h}_seconds"
        lines += [f"# HELP {name} A histogram.", f"# TYPE {name} histogram"]
        for le in range(30):
            lines.append(f'{name}_bucket{{engine="0",le="{le * 0.1:.1f}",model_name="m"}} {le * 7}.0')
        lines += [f'{name}_sum{{engine="0",model_name="m"}} 12.5', f'{name}_count{{engine="0",model_name="m"}} 210.0']
    for c in range(40):
        lines += [f"# TYPE vllm:counter_{c}_total counter", f'vllm:counter_{c}_total{{engine="0",model_name="m"}} 1e6']
    return "\n".join(lines) + "\n"


def naive_parse(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, rest = line.partition(" ") if "{" not in line else line.partition("}")
        out[name] = float(rest.split()[0])
    return out


async def scrape_cost(n: int, seconds: float, page: str) -> tuple[float, int]:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(text=page)

    app = web.Application()
    app.router.add_get("/metrics", handler)
    async with serve_app(app) as port:
        ds = Datastore()
        ds.replace_all([Endpoint(f"e{i}", "127.0.0.1", port) for i in range(n)])
        scraper = MetricsScraper(ds, interval=0.05)
        task = asyncio.create_task(scraper.run())
        await asyncio.sleep(0.5)
        c0, s0 = time.process_time(), scraper.scrapes
        await asyncio.sleep(seconds)
        cpu, scrapes = time.process_time() - c0, scraper.scrapes - s0
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return cpu, scrapes


def serve_page(port_file: str) -> None:
    """The child process: serve big_vllm_page() until killed, write the port to `port_file`."""

    async def run() -> None:
        page = big_vllm_page()

        async def handler(request: web.Request) -> web.Response:
            return web.Response(text=page)

        app = web.Application()
        app.router.add_get("/metrics", handler)
        async with serve_app(app, access_log=False) as port:
            with open(port_file, "w") as f:
                f.write(str(port))
            await asyncio.Event().wait()

    asyncio.run(run())


def sim_page() -> str:
    """The simulators' page after some traffic (its histograms and counters have series), ~5 KiB."""
    from e2e.sim.metrics import SimMetrics

    m = SimMetrics(model_name="Qwen/Qwen2.5-0.5B-Instruct", block_size=16, num_gpu_blocks=65536, max_loras=1,
                   enable_prefix_caching=True)  # fmt: skip
    m.bind(lambda: ([(0, 0, 0, 0.0)], [], []))
    eng = m.engine(0)
    for _ in range(20):
        eng.on_admit(1024, 512, 0.001)
        eng.on_first_token(0.01)
        eng.on_token(0.005)
        eng.on_finish(0.02, 16, "length")
    return m.render().decode()


def serve_pages(port_file: str, n: int, page: str, changing: bool) -> None:
    """The child process of `--loop`: the page on n ports; with `changing`, a counter on it moves every GET."""

    async def run() -> None:
        text = sim_page() if page == "sim" else big_vllm_page()
        count = [0]

        async def handler(request: web.Request) -> web.Response:
            if not changing:
                return web.Response(text=text)
            count[0] += 1
            return web.Response(text=f"{text}bench_gets_total {count[0]}\n")

        ports = []
        async with contextlib.AsyncExitStack() as stack:
            for _ in range(n):
                app = web.Application()
                app.router.add_get("/metrics", handler)
                ports.append(await stack.enter_async_context(serve_app(app, access_log=False)))
            Path(port_file + ".tmp").write_text(",".join(map(str, ports)))
            os.replace(port_file + ".tmp", port_file)
            await asyncio.Event().wait()

    asyncio.run(run())


def loop_cost_child(ports: list[int], seconds: float) -> None:
    """One checkout's scraper (whatever `epp` is importable) over the ports at 50 ms; prints main-thread CPU µs per
    scrape and the scrapes done, as JSON."""

    async def run() -> dict[str, float]:
        ds = Datastore()
        ds.replace_all([Endpoint(f"e{i}", "127.0.0.1", p) for i, p in enumerate(ports)])
        scraper = MetricsScraper(ds, interval=0.05)
        task = asyncio.create_task(scraper.run())
        await asyncio.sleep(1.0)
        r0 = resource.getrusage(resource.RUSAGE_THREAD)
        c0, s0, f0 = time.thread_time(), scraper.scrapes, scraper.failures
        await asyncio.sleep(seconds)
        cpu, scrapes, failures = time.thread_time() - c0, scraper.scrapes - s0, scraper.failures - f0
        r1 = resource.getrusage(resource.RUSAGE_THREAD)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return {"cpu_us_per_scrape": cpu / max(1, scrapes) * 1e6, "scrapes_per_s": scrapes / seconds,
                "failures": failures, "cpu_pct": cpu / seconds * 100,
                "sys_us_per_scrape": (r1.ru_stime - r0.ru_stime) / max(1, scrapes) * 1e6}  # fmt: skip

    print(json.dumps(asyncio.run(run())), flush=True)


def loop_cost(args: argparse.Namespace) -> None:
    sources = [s.partition("@") for s in args.sources.split(",")] if args.sources else [("this", "@", ".")]
    with tempfile.TemporaryDirectory() as tmp:
        port_file = os.path.join(tmp, "ports")
        child = subprocess.Popen(
            [sys.executable, "-m", "e2e.bench.components.scraper", "--serve-pages", port_file, "--endpoints",
             str(args.endpoints), "--page", args.page, *(["--changing"] if args.changing else [])]
        )  # fmt: skip
        try:
            pf = Path(port_file)
            while not pf.exists():
                time.sleep(0.05)
            ports = pf.read_text()
            res: dict[str, list[dict[str, float]]] = {name: [] for name, _, _ in sources}
            for r in range(args.rounds):
                for name, _, tree in sources if r % 2 == 0 else sources[::-1]:
                    env = dict(os.environ, PYTHONPATH=str(Path(tree).resolve()))
                    out = subprocess.run(
                        [sys.executable, __file__, "--loop-child", ports, "--seconds", str(args.seconds)],
                        env=env, cwd=tree, capture_output=True, text=True, check=True,
                    )  # fmt: skip
                    res[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
        finally:
            child.kill()
            child.wait()
    print(
        f"scrape loop, {args.endpoints} endpoints @ 50 ms, page {args.page}{' (changing)' if args.changing else ''}, "
        f"{args.rounds} alternated rounds of {args.seconds:.0f} s, load average {os.getloadavg()[0]:.1f}:"
    )
    for name, rows in res.items():
        per = [x["cpu_us_per_scrape"] for x in rows]
        print(
            f"  {name:12} main-thread CPU per scrape median {statistics.median(per):6.0f} µs "
            f"({' '.join(f'{x:.0f}' for x in per)}), of it in the kernel "
            f"{statistics.median(x.get('sys_us_per_scrape', float('nan')) for x in rows):.0f}; "
            f"{statistics.median(x['cpu_pct'] for x in rows):.2f}% of a core; "
            f"{statistics.median(x['scrapes_per_s'] for x in rows):.0f} scrapes/s; "
            f"failures {sum(x['failures'] for x in rows):.0f}"
        )


async def get_cost(port: int, n: int, rounds: int) -> dict[str, list[float]]:
    """CPU µs per GET of the page (body read, decoded to str), aiohttp vs KeepAliveGet, alternated rounds."""
    url = f"http://127.0.0.1:{port}/metrics"
    out: dict[str, list[float]] = {"aiohttp": [], "keepalive": []}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        raw = KeepAliveGet("127.0.0.1", port, "/metrics")

        async def via_aiohttp() -> None:
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=1.0)) as r:
                await r.text(errors="replace")

        async def via_raw() -> None:
            _, body = await raw.get(1.0)
            body.decode("utf-8", "replace")

        for fn in (via_aiohttp, via_raw):  # warm up
            for _ in range(20):
                await fn()
        for _ in range(rounds):
            for name, fn in (("aiohttp", via_aiohttp), ("keepalive", via_raw)):
                c0 = time.process_time()
                for _ in range(n):
                    await fn()
                out[name].append((time.process_time() - c0) / n * 1e6)
        raw.close()
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--endpoints", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--gets", type=int, default=500, help="GETs per round of the client-only comparison")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--serve", help=argparse.SUPPRESS)
    ap.add_argument("--loop", action="store_true", help="the scrape loop's CPU per scrape (see the docstring)")
    ap.add_argument("--page", choices=("sim", "vllm"), default="sim")
    ap.add_argument("--changing", action="store_true")
    ap.add_argument("--sources", default="", help="--loop: name@checkout,... alternated")
    ap.add_argument("--serve-pages", help=argparse.SUPPRESS)
    ap.add_argument("--loop-child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve:
        serve_page(args.serve)
        return
    if args.serve_pages:
        serve_pages(args.serve_pages, args.endpoints, args.page, args.changing)
        return
    if args.loop_child:
        loop_cost_child([int(p) for p in args.loop_child.split(",")], args.seconds)
        return
    if args.loop:
        loop_cost(args)
        return
    page = big_vllm_page()
    ex = CoreMetricsExtractor()
    ep = Endpoint("e", "127.0.0.1", 1)
    parse_us, naive_us = [], []
    for _ in range(300):
        t0 = time.perf_counter_ns()
        ex.extract(page, ep)
        parse_us.append((time.perf_counter_ns() - t0) / 1000)
        t0 = time.perf_counter_ns()
        naive_parse(page)
        naive_us.append((time.perf_counter_ns() - t0) / 1000)
    p, q = statistics.median(parse_us), statistics.median(naive_us)
    kib = len(page) / 1024
    print(f"page {kib:.0f} KiB: extract p50 {p:.1f} µs; naive full parse p50 {q:.1f} µs; ratio {q / p:.1f}x")
    cpu, scrapes = asyncio.run(scrape_cost(args.endpoints, args.seconds, page))
    per = cpu / scrapes * 1e6 if scrapes else float("nan")
    print(
        f"{args.endpoints} endpoints @ 50 ms for {args.seconds:.0f} s: {scrapes} scrapes "
        f"({scrapes / args.seconds:.0f}/s), "
        f"CPU {cpu / args.seconds * 100:.0f}% of a core (server included), {per:.0f} µs CPU per scrape"
    )
    with tempfile.TemporaryDirectory() as tmp:
        port_file = os.path.join(tmp, "port")
        child = subprocess.Popen([sys.executable, "-m", "e2e.bench.components.scraper", "--serve", port_file])
        try:
            pf = Path(port_file)
            while not pf.exists() or not pf.read_text():
                time.sleep(0.05)
            port = int(pf.read_text())
            res = asyncio.run(get_cost(port, args.gets, args.rounds))
        finally:
            child.kill()
            child.wait()
    a, k = statistics.median(res["aiohttp"]), statistics.median(res["keepalive"])
    print(
        f"GET of the {kib:.0f} KiB page, client CPU only, median of {args.rounds} alternated rounds of {args.gets}: "
        f"aiohttp {a:.0f} µs, KeepAliveGet {k:.0f} µs ({a / k:.1f}x)"
    )


if __name__ == "__main__":
    main()
