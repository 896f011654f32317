"""P/D disaggregation vs aggregated serving, on real Envoy + EPP + simulators, side by side in one run.

P/D: 2 prefill simulators + 2 decode simulators, each decode one behind `epp-pd-sidecar`, EPP with the anchors'
P/D config (`config/llm-d-pd.yaml`, `nonCachedTokens` swept). Aggregated: 4 simulators (role both), EPP with the
anchors' approximate-prefix config (`config/llm-d-approx-prefix.yaml`). Same simulator cost model everywhere
(default: vLLM's chunked prefill, calibrated in docs/disaggregation.md: a decode step next to a prefill chunk pays the
chunk's compute), and the same open-loop workload: prompts (a shared system prompt + a unique document) with mixed
output lengths. Reports TTFT and inter-token latency p50/p90, output throughput and CPU per request.

    python -m e2e.bench.pd.disagg --n 120 --rate 4 --time-scale 3 --outputs 16,64,256 --sweep 0,256,2048,4096
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from e2e.bench import procstat
from e2e.bench.loadgen import percentile
from e2e.harness.sidecar import SidecarProcess, start_sidecar
from e2e.harness.stack import start_stack
from e2e.sim.launch import SimProcess, start_simulators
from e2e.workloads.text import TextFactory
from epp.tokenization.qwen import QWEN25_MODEL

CONFIG_DIR = Path(__file__).resolve().parents[3] / "config"
ROLE = "llm-d.ai/role"


@dataclass
class Sample:
    status: int
    ttft: float | None
    itls: list[float]
    tokens: int
    served: str


@dataclass
class Summary:
    label: str
    ok: int
    n: int
    ttft_p50_ms: float
    ttft_p90_ms: float
    itl_p50_ms: float
    itl_p90_ms: float
    itl_p99_ms: float  # the chunked-prefill stalls: few steps, long ones
    tpot_mean_ms: float  # mean over requests of (end - first token) / (tokens - 1)
    output_tok_s: float
    disaggregated: int  # requests whose prompt a prefill pod computed
    sidecar_cpu_ms_per_req: float = 0.0  # CPU (user+system) of the sidecar processes, per request
    sim_cpu_ms_per_req: float = 0.0  # CPU of the simulators in the setup, per request

    def row(self) -> str:
        return (
            f"| {self.label} | {self.ok}/{self.n} | {self.ttft_p50_ms:.0f} | {self.ttft_p90_ms:.0f} | "
            f"{self.itl_p50_ms:.1f} | {self.itl_p90_ms:.1f} | {self.itl_p99_ms:.0f} | {self.tpot_mean_ms:.1f} | "
            f"{self.output_tok_s:.0f} | {self.disaggregated} | "
            f"{self.sidecar_cpu_ms_per_req:.1f} | {self.sim_cpu_ms_per_req:.1f} |"
        )


def cpu_seconds(pids: Sequence[int]) -> float:
    """User + system CPU seconds of these processes so far."""
    return sum(procstat.cpu_seconds(pid) for pid in pids)


def workload(
    n: int, rate: float, prompt_range: tuple[int, int], outputs: Sequence[int], seed: int
) -> list[dict[str, Any]]:
    """n chat requests, Poisson arrivals at `rate`/s; one of 4 shared 500-token system prompts + a unique document,
    prompt length uniform in `prompt_range`; output length drawn from `outputs`."""
    text = TextFactory(seed)
    rng = random.Random(seed)
    system_len = 500
    t = 0.0
    out = []
    for i in range(n):
        t += rng.expovariate(rate)
        system = text.text(("system", i % 4), system_len)
        doc = text.text(("doc", i), max(1, rng.randint(*prompt_range) - system_len))
        body = {
            "model": QWEN25_MODEL,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": doc}],
            "max_tokens": rng.choice(list(outputs)),
            "stream": True,
        }
        out.append({"arrival": t, "body": body})
    return out


async def _one(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> Sample:
    t0 = time.perf_counter()
    ttft: float | None = None
    last = 0.0
    itls: list[float] = []
    tokens = 0
    try:
        async with session.post(url + "/v1/chat/completions", json=body) as resp:
            served = resp.headers.get("x-inference-port", "")
            if resp.status != 200:
                await resp.read()
                return Sample(resp.status, None, [], 0, served)
            buf = b""
            async for chunk in resp.content.iter_any():
                buf += chunk
                while b"\n\n" in buf:
                    event, buf = buf.split(b"\n\n", 1)
                    if not event.startswith(b"data: ") or event == b"data: [DONE]":
                        continue
                    data = json.loads(event[6:])
                    choices = data.get("choices") or []
                    if not choices or not (choices[0].get("delta") or {}).get("content"):
                        continue
                    now = time.perf_counter() - t0
                    if ttft is None:
                        ttft = now
                    else:
                        itls.append(now - last)
                    last = now
                    tokens += 1
            return Sample(200, ttft, itls, tokens, served)
    except (aiohttp.ClientError, TimeoutError) as e:
        print("request failed:", repr(e))
        return Sample(0, None, [], 0, "")


async def drive(url: str, reqs: list[dict[str, Any]]) -> tuple[list[Sample], float]:
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=512)) as s:
        start = time.perf_counter()

        async def fire(r: dict[str, Any]) -> Sample:
            await asyncio.sleep(max(0.0, r["arrival"] - (time.perf_counter() - start)))
            return await _one(s, url, r["body"])

        samples = await asyncio.gather(*(fire(r) for r in reqs))
        return list(samples), time.perf_counter() - start


def metric_sum(urls: Sequence[str], name: str) -> float:
    total = 0.0
    for u in urls:
        with urllib.request.urlopen(u + "/metrics", timeout=5) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name):
                    total += float(line.rsplit(" ", 1)[1])
    return total


TIME_SCALE = 1.0  # --time-scale: measured durations are divided by it (model time)


def summarize(label: str, samples: list[Sample], duration: float, disaggregated: int) -> Summary:
    ok = [s for s in samples if s.status == 200 and s.ttft is not None]
    ttfts = [s.ttft for s in ok if s.ttft is not None]
    itls = [d for s in ok for d in s.itls]
    ms = 1000 / TIME_SCALE
    return Summary(
        label=label,
        ok=len(ok),
        n=len(samples),
        ttft_p50_ms=percentile(ttfts, 0.5) * ms,
        ttft_p90_ms=percentile(ttfts, 0.9) * ms,
        itl_p50_ms=percentile(itls, 0.5) * ms,
        itl_p90_ms=percentile(itls, 0.9) * ms,
        itl_p99_ms=percentile(itls, 0.99) * ms,
        tpot_mean_ms=sum(sum(s.itls) / len(s.itls) for s in ok if s.itls) / max(1, sum(1 for s in ok if s.itls)) * ms,
        output_tok_s=sum(s.tokens for s in ok) / duration * TIME_SCALE,
        disaggregated=disaggregated,
    )


def with_active_requests(config: str, weight: int) -> str:
    """The config plus `active-request-scorer` (in-flight requests the EPP sent, prefill picks included) in every
    profile: the anchors' P/D sample balances prefill pods only by `queue-scorer`, which sees vLLM's waiting
    queue, empty while requests wait for prefill compute inside the running batch."""
    data = yaml.safe_load(config)
    data["plugins"].append({"type": "active-request-scorer"})
    for profile in data["schedulingProfiles"]:
        profile["plugins"].append({"pluginRef": "active-request-scorer", "weight": weight})
    return str(yaml.safe_dump(data, sort_keys=False))


def pids(sims: Sequence[SimProcess]) -> list[int]:
    return [s.proc.pid for s in sims]


def reset(sims: Sequence[SimProcess]) -> None:
    for s in sims:
        urllib.request.urlopen(urllib.request.Request(s.url + "/reset_prefix_cache", method="POST"), timeout=5)


def endpoints(prefill: Sequence[SimProcess], sidecars: Sequence[SidecarProcess], both: Sequence[SimProcess]) -> str:
    lines = ["endpoints:"]
    for i, s in enumerate(prefill):
        lines.append(f"  - {{name: prefill-{i}, address: 127.0.0.1, port: {s.http_port}, labels: {{{ROLE}: prefill}}}}")
    for i, c in enumerate(sidecars):
        lines.append(f"  - {{name: decode-{i}, address: 127.0.0.1, port: {c.port}, labels: {{{ROLE}: decode}}}}")
    for i, s in enumerate(both):
        lines.append(f"  - {{name: pod-{i}, address: 127.0.0.1, port: {s.http_port}, labels: {{{ROLE}: both}}}}")
    return "\n".join(lines) + "\n"


def run_one(
    workdir: Path,
    config: str,
    reqs: list[dict[str, Any]],
    label: str,
    prefill_urls: list[str],
    sidecar_pids: Sequence[int] = (),
    sim_pids: Sequence[int] = (),
) -> Summary:
    stack = start_stack(workdir, backends=[], config=config)
    split0 = [metric_sum([u], "sim:remote_decode_requests_total") for u in prefill_urls]
    try:
        before = metric_sum(prefill_urls, "sim:remote_decode_requests_total") if prefill_urls else 0.0
        cpu0 = (cpu_seconds(sidecar_pids), cpu_seconds(sim_pids))
        samples, duration = asyncio.run(drive(stack.url, reqs))
        cpu1 = (cpu_seconds(sidecar_pids), cpu_seconds(sim_pids))
        after = metric_sum(prefill_urls, "sim:remote_decode_requests_total") if prefill_urls else 0.0
    finally:
        stack.close()
    s = summarize(label, samples, duration, int(after - before))
    split = [
        int(metric_sum([u], "sim:remote_decode_requests_total") - b) for u, b in zip(prefill_urls, split0, strict=True)
    ]
    if prefill_urls:
        print(f"  prefills per prefill pod: {split}", flush=True)
    s.sidecar_cpu_ms_per_req = (cpu1[0] - cpu0[0]) * 1000 / len(reqs)
    s.sim_cpu_ms_per_req = (cpu1[1] - cpu0[1]) * 1000 / len(reqs)
    print(s.row(), flush=True)
    return s


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=150)
    p.add_argument("--rate", type=float, default=6.0, help="requests per second (Poisson)")
    p.add_argument("--prompt-tokens", default="1000,6000", help="prompt length range (tokens), uniform")
    p.add_argument("--outputs", default="8,32,128", help="output lengths, drawn uniformly")
    p.add_argument("--sweep", default="0,256,1024,2048,4096", help="nonCachedTokens values for the P/D runs")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-num-seqs", default="64", help="simulator batch slots per pod")
    p.add_argument(
        "--engine-model", choices=["chunked", "per-request"], default="chunked",
        help="chunked: vLLM's chunked prefill (a shared prefill at --prefill-tps, --chunk tokens per step, decode "
        "steps next to a chunk pay its compute); per-request: each prefill on its own, --interference factor",
    )  # fmt: skip
    p.add_argument("--prefill-tps", default="10000", help="chunked: prefill tokens/s per engine")
    p.add_argument("--chunk", default="2048", help="chunked: --max-num-batched-tokens")
    p.add_argument("--interference", default="1.0", help="per-request: simulator --prefill-interference")
    p.add_argument(
        "--time-scale", type=float, default=1.0,
        help="modelled durations x this, arrival rate / this; latencies are reported / this (model time), so the "
        "machine's CPU cost per request weighs that much less",
    )  # fmt: skip
    p.add_argument(
        "--active-request-weight", type=int, default=0,
        help="> 0: add active-request-scorer with this weight to every profile of both configs (0: the anchors' "
        "configs unchanged)",
    )  # fmt: skip
    p.add_argument("--json", default="", help="write the summaries here")
    a = p.parse_args(argv)
    sim_args = [
        "--model", QWEN25_MODEL, "--block-size", "16", "--num-gpu-blocks", "16384", "--max-num-seqs", a.max_num_seqs,
        "--prefill-overhead", "0.01", "--inter-token-latency", "0.01", "--time-factor-under-load", "1.5",
        "--kv-transfer-overhead", "0.002", "--kv-transfer-time-per-block", "0.0001", "--time-scale", str(a.time_scale),
    ]  # fmt: skip
    if a.engine_model == "chunked":
        sim_args += ["--prefill-tokens-per-second", a.prefill_tps, "--max-num-batched-tokens", a.chunk]
    else:
        sim_args += ["--prefill-time-per-token", "0.0001", "--prefill-interference", a.interference]
    global TIME_SCALE
    TIME_SCALE = a.time_scale
    outputs = [int(x) for x in a.outputs.split(",")]
    lo, _, hi = a.prompt_tokens.partition(",")
    reqs = workload(a.n, a.rate / a.time_scale, (int(lo), int(hi or lo)), outputs, a.seed)
    pd_base = (CONFIG_DIR / "llm-d-pd.yaml").read_text()
    agg_base = (CONFIG_DIR / "llm-d-approx-prefix.yaml").read_text()
    pd_base = pd_base.replace("nonCachedTokens: 16", "nonCachedTokens: THRESHOLD")
    if a.active_request_weight > 0:
        pd_base = with_active_requests(pd_base, a.active_request_weight)
        agg_base = with_active_requests(agg_base, a.active_request_weight)
    summaries: list[Summary] = []
    with tempfile.TemporaryDirectory(prefix="bench-pd-") as tmp:
        workdir = Path(tmp)
        print(
            "| setup | ok | TTFT p50 ms | TTFT p90 ms | ITL p50 ms | ITL p90 ms | ITL p99 ms | TPOT mean ms "
            "| output tok/s | via prefill pod | sidecar CPU ms/req | sim CPU ms/req |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        roles = ["prefill", "prefill", "decode", "decode", "both", "both", "both", "both"]
        with start_simulators(
            8, base_args=sim_args, per_sim_args=lambda i: ["--role", roles[i]], events=False, timeout=300
        ) as sims:
            prefill, decode, both = sims[:2], sims[2:4], sims[4:]
            summaries.append(
                run_one(workdir, agg_base + endpoints([], [], both), reqs, "aggregated x4", [], (), pids(both))
            )
            sidecars = [start_sidecar(workdir, d.http_port, "--kv-connector", "nixlv2") for d in decode]
            try:
                for threshold in [int(x) for x in a.sweep.split(",")]:
                    reset(sims[:4])
                    cfg = pd_base.replace("nonCachedTokens: THRESHOLD", f"nonCachedTokens: {threshold}")
                    assert f"nonCachedTokens: {threshold}" in cfg
                    label = f"P/D 2+2, nonCachedTokens {threshold}" + (" (off)" if threshold == 0 else "")
                    cfg += endpoints(prefill, sidecars, [])
                    summaries.append(
                        run_one(
                            workdir,
                            cfg,
                            reqs,
                            label,
                            [x.url for x in prefill],
                            [c.proc.pid for c in sidecars],
                            pids([*prefill, *decode]),
                        )
                    )
            finally:
                for c in sidecars:
                    c.stop()
    if a.json:
        Path(a.json).write_text(json.dumps([asdict(s) for s in summaries], indent=2))
    agg = summaries[0]
    for r in summaries[1:]:
        print(
            f"{r.label} vs aggregated: TTFT p50 x{r.ttft_p50_ms / agg.ttft_p50_ms:.2f}, "
            f"ITL p50 x{r.itl_p50_ms / agg.itl_p50_ms:.2f}, ITL p90 x{r.itl_p90_ms / agg.itl_p90_ms:.2f}, "
            f"ITL p99 x{r.itl_p99_ms / agg.itl_p99_ms:.2f}, TPOT x{r.tpot_mean_ms / agg.tpot_mean_ms:.2f}, "
            f"throughput x{r.output_tok_s / agg.output_tok_s:.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
