"""Open-loop load generator for OpenAI streaming endpoints: sends each request at its arrival time and
measures TTFT (first streamed token), end-to-end latency, cached prompt tokens and the serving pod."""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp

from e2e.harness.picklog import REPLAY_HEADER
from e2e.workloads.base import Request

PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


@dataclass(slots=True)
class Result:
    group: str
    status: int
    ttft: float | None  # seconds
    e2e: float
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    served_by: str = ""
    error: str = ""


@dataclass
class RunSummary:
    label: str
    n: int
    ok: int
    duration: float
    ttft_p50: float
    ttft_p90: float
    ttft_p99: float
    ttft_mean: float
    e2e_p50: float
    throughput_rps: float
    output_tok_s: float
    kv_hit_rate: float  # cached prompt tokens / prompt tokens
    load_cv: float  # coefficient of variation of requests per pod
    per_pod: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    k = (len(s) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summarize(label: str, results: Sequence[Result], duration: float, pods: Sequence[str] = ()) -> RunSummary:
    ok = [r for r in results if r.status == 200 and r.ttft is not None]
    ttfts = [r.ttft for r in ok if r.ttft is not None]
    prompt = sum(r.prompt_tokens for r in ok)
    counts = Counter(r.served_by for r in ok if r.served_by)
    per_pod = {p: counts.get(p, 0) for p in (pods or sorted(counts))}
    loads = list(per_pod.values())
    mean_load = statistics.fmean(loads) if loads else 0.0
    cv = statistics.pstdev(loads) / mean_load if loads and mean_load else 0.0
    return RunSummary(
        label=label,
        n=len(results),
        ok=len(ok),
        duration=duration,
        ttft_p50=percentile(ttfts, 0.5),
        ttft_p90=percentile(ttfts, 0.9),
        ttft_p99=percentile(ttfts, 0.99),
        ttft_mean=statistics.fmean(ttfts) if ttfts else float("nan"),
        e2e_p50=percentile([r.e2e for r in ok], 0.5),
        throughput_rps=len(ok) / duration if duration else 0.0,
        output_tok_s=sum(r.completion_tokens for r in ok) / duration if duration else 0.0,
        kv_hit_rate=sum(r.cached_tokens for r in ok) / prompt if prompt else 0.0,
        load_cv=cv,
        per_pod=per_pod,
    )


async def _one(
    session: aiohttp.ClientSession, base_url: str, req: Request, served_header: str, timeout: float, index: int = -1
) -> Result:
    """One request; `index` (its place in the workload) goes in the replay header, so pick logs of two runs of the
    same workload match request by request."""
    t0 = time.perf_counter()
    ttft: float | None = None
    usage: dict[str, Any] = {}
    headers = req.headers if index < 0 else {**req.headers, REPLAY_HEADER: str(index)}
    try:
        async with session.post(
            base_url + PATHS[req.api], json=req.body, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout)
        ) as resp:
            served = resp.headers.get(served_header, "")
            if resp.status != 200:
                text = await resp.text()
                return Result(
                    req.group, resp.status, None, time.perf_counter() - t0, served_by=served, error=text[:200]
                )
            buf = b""
            async for chunk in resp.content.iter_any():
                buf += chunk
                while b"\n\n" in buf:
                    event, buf = buf.split(b"\n\n", 1)
                    for line in event.split(b"\n"):
                        if not line.startswith(b"data: ") or line == b"data: [DONE]":
                            continue
                        data = json.loads(line[6:])
                        if ttft is None and data.get("choices"):
                            ttft = time.perf_counter() - t0
                        if data.get("usage"):
                            usage = data["usage"]
            details = usage.get("prompt_tokens_details") or {}
            return Result(
                req.group,
                200,
                ttft,
                time.perf_counter() - t0,
                prompt_tokens=int(usage.get("prompt_tokens", 0)),
                cached_tokens=int(details.get("cached_tokens", 0) or 0),
                completion_tokens=int(usage.get("completion_tokens", 0)),
                served_by=served,
            )
    except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError) as e:
        return Result(req.group, 0, None, time.perf_counter() - t0, error=repr(e))


async def run(
    base_url: str,
    requests: Sequence[Request],
    *,
    served_header: str = "x-served-by",
    max_concurrency: int = 256,
    timeout: float = 120.0,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[list[Result], float]:
    """Send every request at its arrival time (open loop, capped concurrency); return results and duration."""
    sem = asyncio.Semaphore(max_concurrency)
    results: list[Result | None] = [None] * len(requests)
    done = 0
    connector = aiohttp.TCPConnector(limit=max_concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        start = time.perf_counter()

        async def fire(i: int, req: Request) -> None:
            nonlocal done
            delay = req.arrival - (time.perf_counter() - start)
            if delay > 0:
                await asyncio.sleep(delay)
            async with sem:
                results[i] = await _one(session, base_url, req, served_header, timeout, i)
            done += 1
            if progress:
                progress(done, len(requests))

        await asyncio.gather(*(fire(i, r) for i, r in enumerate(requests)))
        duration = time.perf_counter() - start
    return [r for r in results if r is not None], duration
