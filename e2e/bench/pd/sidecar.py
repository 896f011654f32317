"""What the P/D path itself costs, with the engines' modelled work taken out (prefill 0, ITL 1 ms).

One prefill simulator, one decode simulator behind `epp-pd-sidecar`; sequential streaming chat requests (a unique
~3,000-token document, 32 output tokens), four ways, interleaved in rounds so machine noise hits all alike:
- `direct`: to the decode simulator (the floor);
- `sidecar, local`: through the sidecar without a prefiller header (the proxy hop alone);
- `client-side P/D`: the client itself sends the prefill (max_tokens 1, kv_transfer_params) to the prefill simulator
  and then the decode with the returned params to the decode simulator (the protocol's cost: two engine requests,
  one after the other, without our proxy);
- `sidecar, P/D`: through the sidecar with `x-prefiller-host-port` (the protocol + our proxy).
Reports median TTFT and end-to-end time, and the sidecar's CPU per request (user + system, /proc).

    python -m e2e.bench.pd.sidecar --n 60
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from e2e.bench.pd.disagg import cpu_seconds
from e2e.harness.sidecar import start_sidecar
from e2e.sim.launch import start_simulators
from e2e.workloads.text import TextFactory
from epp.tokenization.qwen import QWEN25_MODEL

REMOTE_DECODE = {
    "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None, "remote_block_ids": None,
    "remote_host": None, "remote_port": None,
}  # fmt: skip
MODES = ("direct", "sidecar, local", "client-side P/D", "sidecar, P/D")


async def stream(
    s: aiohttp.ClientSession, url: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[float, float]:
    """(seconds to the first content chunk, seconds to the end)."""
    t0 = time.perf_counter()
    ttft = 0.0
    async with s.post(url + "/v1/chat/completions", json=body, headers=headers or {}) as r:
        assert r.status == 200, await r.text()
        async for line in r.content:
            if ttft == 0.0 and line.startswith(b"data: ") and b'"content":"' in line and b'"content":""' not in line:
                ttft = time.perf_counter() - t0
    return ttft, time.perf_counter() - t0


async def run(n: int, prompt_tokens: int, out_tokens: int) -> dict[str, dict[str, float]]:
    sim_args = ["--model", QWEN25_MODEL, "--prefill-overhead", "0", "--prefill-time-per-token", "0",
                "--inter-token-latency", "0.001", "--kv-transfer-overhead", "0", "--kv-transfer-time-per-block", "0",
                "--max-num-seqs", "8", "--num-gpu-blocks", "16384"]  # fmt: skip
    text = TextFactory(7)
    results: dict[str, list[tuple[float, float]]] = {m: [] for m in MODES}
    cpu = dict.fromkeys(MODES, 0.0)
    with (
        tempfile.TemporaryDirectory(prefix="bench-pd-overhead-") as tmp,
        start_simulators(
            2, base_args=sim_args, per_sim_args=lambda i: ["--role", ["prefill", "decode"][i]], events=False,
            timeout=300,
        ) as sims,
    ):  # fmt: skip
        prefill, decode = sims
        sidecar = start_sidecar(Path(tmp), decode.http_port, "--kv-connector", "nixlv2")
        try:
            pid = sidecar.proc.pid
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
                for i in range(-2, n):  # two warm-up rounds
                    for mode in MODES:
                        doc = text.text(("doc", i, mode), prompt_tokens)
                        body = {"model": QWEN25_MODEL, "messages": [{"role": "user", "content": doc}],
                                "max_tokens": out_tokens, "stream": True}  # fmt: skip
                        c0 = cpu_seconds([pid])
                        if mode == "direct":
                            r = await stream(s, decode.url, body)
                        elif mode == "sidecar, local":
                            r = await stream(s, sidecar.url, body)
                        elif mode == "client-side P/D":
                            t0 = time.perf_counter()
                            p = {**body, "stream": False, "max_tokens": 1, "kv_transfer_params": REMOTE_DECODE}
                            async with s.post(prefill.url + "/v1/chat/completions", json=p) as resp:
                                params = (await resp.json())["kv_transfer_params"]
                            ttft, total = await stream(s, decode.url, {**body, "kv_transfer_params": params})
                            prefill_s = time.perf_counter() - t0 - total
                            r = (prefill_s + ttft, prefill_s + total)
                        else:
                            r = await stream(s, sidecar.url, body, {"x-prefiller-host-port": prefill.hostport})
                        if i >= 0:
                            results[mode].append(r)
                            cpu[mode] += cpu_seconds([pid]) - c0
        finally:
            sidecar.stop()
    return {
        m: {
            "ttft_p50_ms": statistics.median(x[0] for x in results[m]) * 1000,
            "e2e_p50_ms": statistics.median(x[1] for x in results[m]) * 1000,
            "sidecar_cpu_ms_per_req": cpu[m] * 1000 / n,
        }
        for m in MODES
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=60, help="requests per mode")
    p.add_argument("--prompt-tokens", type=int, default=3000)
    p.add_argument("--output-tokens", type=int, default=32)
    p.add_argument("--json", default="")
    a = p.parse_args(argv)
    out = asyncio.run(run(a.n, a.prompt_tokens, a.output_tokens))
    print("| path | TTFT p50 ms | end-to-end p50 ms | sidecar CPU ms/req |")
    print("|---|---|---|---|")
    for mode, r in out.items():
        print(f"| {mode} | {r['ttft_p50_ms']:.1f} | {r['e2e_p50_ms']:.1f} | {r['sidecar_cpu_ms_per_req']:.2f} |")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
