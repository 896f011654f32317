"""`make bench-routing`: the routing workload suite, every strategy side by side on the same requests.

Each cell is (workload, pods, block size). Per cell the simulated pods (e2e.sim, shared-prefill model: FCFS
prefill at `--prefill-tokens-per-second` per pod, decodes slowed while a prefill runs, a KV cache of fixed
capacity with LRU eviction and KV events) are started once; for each strategy their caches are reset, an EPP
with that strategy's config and an Envoy in front of it are started, and the same requests (same prompts, same
arrival times) are replayed through Envoy by an open-loop generator. Reported per cell and strategy: TTFT
p50/p90/p99, throughput, KV hit (cached prompt tokens / prompt tokens, from `usage.prompt_tokens_details`), the
workload's reuse bounds (from its block hashes: unlimited cache, and the pods' capacity pooled under offline-optimal
eviction, `e2e.workloads.reuse`), the share of the capacity bound captured, and the spread of requests over pods
(coefficient of variation).

    python -m e2e.bench.routing.suite                       # the default (reduced) matrix, see docs/benchmarks.md
    python -m e2e.bench.routing.suite --workloads agentic,no-reuse --pods 4 --block-sizes 16
    python -m e2e.bench.routing.suite --quick               # small and fast (smoke test)
    python -m e2e.bench.routing.suite --plots docs/bench-routing   # also write one PNG per workload there
    python -m e2e.bench.routing.suite --workloads shared-prefix-demo --cells 4:16 --repeats 5 --draws
                                                            # five draws of the workload (seeds), medians

A draw is fixed: its arrivals, groups and prompts are the same in every repeat, so `--repeats` alone measures the
machine's noise on one draw; `--draws` makes repeat r run draw r (another seed; Mooncake: another sample of its
conversations), which samples how a workload's groups fall on the pods too.

Results: <out>/results.json (every cell, every request), <out>/results.md (the tables), <out>/<workload>.png.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import yaml

from e2e.bench import loadgen
from e2e.bench.progress import Progress
from e2e.bench.routing.affinity_trace import lost_reuse
from e2e.harness import picklog
from e2e.harness.engines import EnginePool, EngineSpec, load_engine, render_ids
from e2e.harness.external import ExternalEpp, checked_externals, pool_values
from e2e.harness.http import post_json
from e2e.harness.ports import free_ports
from e2e.harness.simconfig import pod_name
from e2e.harness.stack import Stack, start_stack
from e2e.sim.launch import SimProcess, loopback_hosts, start_simulator, start_simulators
from e2e.sim.tokenizer import shared_tokenizer
from e2e.strategies import EXTERNAL, OURS, available_strategies, config_text, endpoints_yaml
from e2e.workloads.agentic import agentic, no_reuse
from e2e.workloads.base import Request, Workload
from e2e.workloads.mooncake import mooncake_conversations
from e2e.workloads.multiturn import multi_turn_chat
from e2e.workloads.reuse import capacity_bound, prompt_ids, reuse_bound
from e2e.workloads.shared_prefix import shared_prefix

log = logging.getLogger(__name__)
TRACE = Path("/work/shared/traces/conversation_trace.jsonl")
REPO_TRACE = Path(__file__).resolve().parents[2] / "workloads" / "data" / "conversation_trace.jsonl"
SERVED_HEADER = "x-inference-pod"
MODEL = "Qwen/Qwen2.5-0.5B-Instruct"


@dataclass(frozen=True)
class SimModel:
    """The simulated pod (time-compressed: a 0.5B-class engine on a small GPU)."""

    prefill_tokens_per_second: float = 2000.0
    prefill_overhead: float = 0.010
    inter_token_latency: float = 0.010
    prefill_interference: float = 0.5
    max_num_seqs: int = 6
    time_factor_under_load: float = 1.5
    # Every modelled duration x3 (and the workloads' rates /3): the 2-core machine's CPU, shared with other jobs,
    # must not be what limits throughput, or the benchmark measures the machine instead of the routing. The
    # workloads below are written for 3; another scale replays their arrival times x time_scale / 3 (`timed`).
    time_scale: float = 3.0

    @property
    def effective_prefill_tps(self) -> float:
        return self.prefill_tokens_per_second / self.time_scale

    def timed(self, workload: Workload, warmup: float) -> tuple[Workload, float]:
        """`workload` (written for time scale 3) at this model's time scale: every arrival (and the warm-up) x
        time_scale / 3, so the simulated pods see the same load in their own time."""
        f = self.time_scale / 3.0
        if f == 1.0:
            return workload, warmup
        for r in workload.requests:
            r.arrival *= f
        workload.params["time_factor"] = f
        return workload, warmup * f

    def args(self, block_size: int, kv_tokens: int) -> list[str]:
        return [
            "--block-size", str(block_size), "--num-gpu-blocks", str(max(8, kv_tokens // block_size)),
            "--max-num-seqs", str(self.max_num_seqs),
            "--prefill-tokens-per-second", str(self.prefill_tokens_per_second),
            "--prefill-overhead", str(self.prefill_overhead),
            "--inter-token-latency", str(self.inter_token_latency),
            "--prefill-interference", str(self.prefill_interference),
            "--time-factor-under-load", str(self.time_factor_under_load),
            "--time-scale", str(self.time_scale),
        ]  # fmt: skip


@dataclass(frozen=True)
class WorkloadSpec:
    """A workload at a pod count: `make(pods, scale, draw)` builds the requests (draw 0 is the published one, each
    other draw the same shape from another seed or, for the trace, another sample of its conversations);
    `kv_tokens` is the KV capacity per pod."""

    name: str
    make: Callable[[int, float, int], Workload]
    kv_tokens: int
    warmup: float  # requests arriving in the first `warmup` seconds are sent but not counted
    about: str

    def pod_blocks(self, block_size: int) -> int:
        """KV blocks per pod at `block_size` (what the simulators are configured with)."""
        return max(8, self.kv_tokens // block_size)


def counted_after(workload: Workload, warmup: float) -> tuple[Workload, float]:
    """The warm-up, at most half the run: a short run (`--quick`, a small `--scale`) still counts its second half,
    where a fixed warm-up of 6-8 s outlasted the demo's and multi-turn's arrivals at scale 0.3 and counted none."""
    return workload, min(warmup, workload.duration / 2)


def trace_path() -> Path:
    return TRACE if TRACE.exists() else REPO_TRACE


def _per_pod(pods: int) -> float:
    return pods / 4.0


def demo_shape(rate: float, num_requests: int, seed: int = 1) -> Workload:
    """`make demo`'s shared-prefix shape: 16 system prompts of 1024 tokens x 8 questions of 64, 8 output tokens."""
    return shared_prefix(
        num_groups=16,
        num_prompts_per_group=8,
        system_prompt_len=1024,
        question_len=64,
        output_len=8,
        rate=rate,
        num_requests=num_requests,
        seed=seed,
    )


WORKLOADS: dict[str, WorkloadSpec] = {
    spec.name: spec
    for spec in [
        WorkloadSpec(
            "shared-prefix-demo",
            lambda pods, s, d: demo_shape(4.0 * _per_pod(pods), int(110 * s * _per_pod(pods)), seed=1 + d),
            kv_tokens=8192,
            warmup=8.0,
            about="`make demo`'s shape: 16 system prompts of 1024 tokens x 8 questions of 64 tokens; a pod's cache "
            "holds about half of the system prompts",
        ),
        WorkloadSpec(
            "shared-prefix-150x5",
            lambda pods, s, d: shared_prefix(
                num_groups=30 * pods // 4,
                num_prompts_per_group=5,
                system_prompt_len=1200,
                question_len=240,
                output_len=8,
                rate=2.7 * _per_pod(pods),
                num_requests=int(75 * s * _per_pod(pods)),
                seed=2 + d,
            ),
            kv_tokens=16384,
            warmup=8.0,
            about="llm-d blog's 150 groups x 5 prompts (6000 + 1200 tokens) scaled down: 30 groups per 4 pods x 5 "
            "prompts, 1200 + 240 tokens; the system prompts fill ~55% of the cluster's KV capacity",
        ),
        WorkloadSpec(
            "multi-turn",
            lambda pods, s, d: multi_turn_chat(
                num_sessions=int(12 * _per_pod(pods) * s),
                turns=5,
                system_prompt_len=1000,
                user_len=150,
                output_len=8,
                rate=2.0 * _per_pod(pods),
                seed=3 + d,
            ),
            kv_tokens=6144,
            warmup=6.0,
            about="chat sessions sharing one 1000-token system prompt, 5 turns each resending the whole "
            "conversation (150-token user turns); the cluster's KV capacity is about the sessions' working set",
        ),
        WorkloadSpec(
            "agentic",
            lambda pods, s, d: agentic(
                num_agents=int(8 * _per_pod(pods) * s),
                steps=6,
                system_prompt_len=1500,
                task_len=150,
                tool_output_len=(80, 400),
                output_len=8,
                agent_rate=0.4 * _per_pod(pods),
                step_gap=3.0,
                fanout_prob=0.3,
                fanout=(3, 4),
                subagent_steps=2,
                seed=4 + d,
            ),
            kv_tokens=16384,
            warmup=6.0,
            about="agents sharing a 1500-token tool prompt; each step appends a tool output (80-400 tokens); "
            "30% of steps fan out 3-4 sub-agents at once (a burst sharing the agent's context), 2 steps each",
        ),
        WorkloadSpec(
            "mooncake",
            lambda pods, s, d: mooncake_conversations(
                trace_path(),
                every=max(1, round(135 / _per_pod(pods) / s)),
                phase=d,
                duration=30.0 * s,
                block_tokens=16,
                max_output=8,
            ),
            kv_tokens=16384,
            warmup=6.0,
            about="Mooncake FAST'25 conversation trace: whole conversations (second block id % k == 0; k = 135 at "
            "4 pods, 68 at 8), 512-token blocks -> 16 tokens, the hour compressed to 30 s, outputs capped at 16",
        ),
        WorkloadSpec(
            "no-reuse",
            lambda pods, s, d: no_reuse(
                num_requests=int(75 * s * _per_pod(pods)),
                prompt_len=(300, 900),
                output_len=8,
                rate=2.7 * _per_pod(pods),
                seed=5 + d,
            ),
            kv_tokens=16384,
            warmup=3.0,
            about="unique prompts of 300-900 tokens: nothing to reuse, only load balance matters",
        ),
    ]
}


@dataclass
class Cell:
    workload: str
    pods: int
    block_size: int
    requests: int
    duration: float
    bound: float  # unlimited-cache reuse bound (share of prompt tokens)
    params: dict[str, Any]
    summaries: list[dict[str, Any]] = field(default_factory=list)  # per strategy: medians over the repeats
    repeats: list[list[dict[str, Any]]] = field(default_factory=list)  # per repeat, per strategy: one run each
    cap_bound: float = float("nan")  # the pods' capacity pooled, offline-optimal eviction (share of prompt tokens)


def _post_ok(url: str, body: object, timeout: float) -> None:
    r = post_json(url, body, timeout=timeout)
    if r.status != 200:
        raise RuntimeError(f"POST {url}: HTTP {r.status}: {r.body[:200]!r}")


def reset_caches(sims: Sequence[SimProcess]) -> None:
    for s in sims:
        _post_ok(s.url + "/reset_prefix_cache", {}, timeout=10)


def warm_up(url: str, model: str, within: float = 60.0) -> None:
    """One request through the whole path, so one-time costs (tokenizer load, connections) are not measured; retried
    for `within` seconds while it is not answered 200 (an external EPP may listen before it has found its pods)."""
    deadline = time.monotonic() + within
    while True:
        try:
            _post_ok(url + "/v1/completions", {"model": model, "prompt": "warm up", "max_tokens": 1}, timeout=60)
            return
        except (RuntimeError, OSError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


OURS_OVERRIDES: dict[str, Any] = {}  # --ours-params: parameters to try (tuning; see e2e.strategies._ours)
VARIANTS: dict[str, dict[str, Any]] = {}  # --variants: more "pyepp-default/<name>" strategies (tuning)
SOURCES: dict[str, Path] = {}  # --sources: "pyepp-default@<name>" runs the EPP of another checkout (A/B of code)


def _nice_thread() -> None:
    os.setpriority(os.PRIO_PROCESS, 0, 19)  # this thread only (Linux); the processes it starts inherit it


def _renice(pid: int, value: int) -> None:
    """Every thread of `pid` (setpriority on a pid changes one thread on Linux)."""
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, int(tid), value)


def _renice_children(value: int) -> None:
    """Every niced child process of this one (the stacks being started), every thread of it."""
    me = str(os.getpid())
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": state, ppid, ..., nice is field 19
        if fields[1] == me and int(fields[16]) > value:
            _renice(int(pid), value)


class Stacks:
    """Each strategy's EPP + Envoy, started one strategy ahead in a background thread at nice 19 (its processes
    inherit that), so the next start-up (~6-10 s of CPU on this machine) overlaps the current run without
    competing with it; when its turn comes, its processes are reniced to 0. Stopping happens in the background too.
    This cuts the suite's wall time by the start-ups; the run itself is unchanged (a fresh EPP per strategy)."""

    def __init__(self, sims: Sequence[SimProcess], block_size: int, workdir: Path, model: SimModel) -> None:
        self.sims, self.block_size, self.workdir, self.model = sims, block_size, workdir, model
        self._starter = ThreadPoolExecutor(1, thread_name_prefix="stack-start", initializer=_nice_thread)
        self._stopper = ThreadPoolExecutor(1, thread_name_prefix="stack-stop")
        self._pending: list[Future[Stack]] = []
        self._strategy: dict[Future[Stack], str] = {}

    def _start(self, strategy: str) -> Stack:
        strategy_config, _, source = strategy.partition("@")
        base, _, variant = strategy_config.partition("/")
        if base in EXTERNAL:
            return self._start_external(EXTERNAL[base], strategy)
        text = config_text(
            base, self.sims, block_size=self.block_size, prefill_tps=self.model.effective_prefill_tps,
            ours_overrides={**OURS_OVERRIDES, **VARIANTS.get(variant, {})},
        )  # fmt: skip
        events = ""
        if isinstance(self.sims, EnginePool):
            events = self._events_endpoint()
            text = for_engine(text, events if ENGINE and ENGINE.events == "connect" else "", self.sims.render_url)
        d = self.workdir / f"{strategy.replace('/', '_').replace('@', '_')}-{time.monotonic_ns()}"
        d.mkdir(parents=True, exist_ok=True)
        # Pod health from scrapes is off: the simulated pods never die, but on this loaded 2-core machine their
        # /metrics answers can take over a second, and a pod dropped as "hung" would measure the machine, not routing.
        args = ["--endpoint-stale-after", "0", "--endpoint-max-scrape-failures", "0"]
        # --pick-logs: every pick with its scores in Envoy's access log, each scorer's term in the EPP's (V(5)) log
        args += ["--emit-endpoint-scores", "--v", "5"] if PICK_LOGS else ["--log-level", "warning"]
        stack = start_stack(
            d, backends=[], config=text, epp_args=args, ready_timeout=180.0, epp_source=SOURCES.get(source),
            epp_log_level="", envoy_overrides=_pick_log(d),
        )  # fmt: skip
        stack.events_endpoint = events
        return stack

    def _events_endpoint(self) -> str:
        """Where an engine pool's pods send their KV events during this stack's run (its EPP binds it)."""
        return f"tcp://127.0.0.1:{free_ports(1)[0]}"

    def _start_external(self, spec: ExternalEpp, strategy: str) -> Stack:
        """Another EPP from its command line, over the same pods: its config's placeholders filled from them."""
        d = self.workdir / f"{strategy.replace('/', '_')}-{time.monotonic_ns()}"
        d.mkdir(parents=True, exist_ok=True)
        events = self._events_endpoint() if isinstance(self.sims, EnginePool) else ""
        values = external_values(self.sims, d, self.block_size, self.model.effective_prefill_tps, events)
        stack = start_stack(d, backends=[], config=spec.config_text(values), external=spec, external_values=values,
                            ready_timeout=180.0, envoy_overrides=_pick_log(d))  # fmt: skip
        stack.events_endpoint = events
        return stack

    def prestart(self, strategy: str) -> Future[Stack]:
        started = self._starter.submit(self._start, strategy)
        self._pending.append(started)
        self._strategy[started] = strategy
        return started

    def pending(self, strategy: str) -> Future[Stack]:
        """The stack of `strategy` prestarted and not taken yet (by the previous cell's last run), else a new one."""
        for started in self._pending:
            if self._strategy.get(started) == strategy:
                return started
        return self.prestart(strategy)

    def take(self, started: Future[Stack]) -> Stack:
        """The started stack at normal priority; one still starting is reniced first (at nice 19 it would starve on
        a machine loaded by other jobs)."""
        _renice_children(0)
        stack = started.result()
        self._pending.remove(started)  # only now: if interrupted before, close() stops it
        self._strategy.pop(started, None)
        _renice_children(0)
        return stack

    def stop(self, stack: Stack, picks: Path | None = None) -> None:
        """Stops `stack` in the background; with `picks`, then writes its pick log there (Envoy's access log is
        complete once Envoy has exited)."""
        self._stopper.submit(self._stop, stack, picks)

    @staticmethod
    def _stop(stack: Stack, picks: Path | None) -> None:
        stack.close()
        if picks is not None:
            write_picks(stack, picks)

    def close(self) -> None:
        """Stops what was started and not taken (a run failed), then waits for every stop."""
        self._starter.shutdown(wait=True)
        for started in self._pending:
            if started.exception() is None:
                self.stop(started.result())
        self._stopper.shutdown(wait=True)


def external_values(
    sims: Sequence[SimProcess], workdir: Path, block_size: int, prefill_tps: float, events_endpoint: str = ""
) -> dict[str, object]:
    """An external EPP's placeholders over the suite's pods (e2e.harness.external.pool_values), tokenizing through
    the engine's render API or the suite's render server."""
    render = sims.render_url if isinstance(sims, EnginePool) else RENDER_URL
    return pool_values(sims, workdir, endpoints=endpoints_yaml(sims), block_size=block_size, prefill_tps=prefill_tps,
                       model=MODEL, render_url=render or sims[0].url, events_endpoint=events_endpoint)  # fmt: skip


def engine_ids(req: Request, pool: EnginePool) -> list[int]:
    """A prompt's token ids as the pool's engine counts them: its render API when it has its own tokenizer."""
    return render_ids(pool.render_url, req.body, req.api) if pool.render_url else prompt_ids(req, shared_tokenizer())


PRECISE_TYPES = ("precise-prefix-cache-producer", "precise-prefix-cache-scorer")


def for_engine(text: str, events_endpoint: str, render_url: str) -> str:
    """One of our strategies' configs over an engine pool: its precise plugins bind the SUB the pods dial
    (`kvEventsConfig.zmqEndpoint`) and tokenize through the engine's render API when it has its own tokenizer."""
    doc = yaml.safe_load(text)
    for p in doc.get("plugins") or []:
        params = p.setdefault("parameters", {}) if p.get("type") in (*PRECISE_TYPES, "token-producer") else None
        if params is None:
            continue
        if p["type"] in PRECISE_TYPES and events_endpoint:
            params.setdefault("kvEventsConfig", {})["zmqEndpoint"] = events_endpoint
        if render_url:
            params["vllm"] = {"url": render_url}
    return str(yaml.safe_dump(doc, sort_keys=False))


def run_strategy(
    strategy: str, stack: Stack, sims: Sequence[SimProcess], workload: Workload, label: str = ""
) -> tuple[list[loadgen.Result], float]:
    """The workload through `stack` (this strategy's EPP and Envoy), from caches reset on every pod (an engine
    pool's pods restarted, sending their events where this EPP listens); progress (`label`, default the strategy)
    on stderr."""
    if isinstance(sims, EnginePool):
        sims.restart(stack.events_endpoint)
        warm_up(stack.url, str(workload.requests[0].body["model"]))
    else:
        warm_up(stack.url, str(workload.requests[0].body["model"]))
        reset_caches(sims)
    time.sleep(1.0)  # the EPP sees the caches cleared (events) and fresh metrics before traffic
    progress = Progress(label or strategy, len(workload.requests))
    return asyncio.run(loadgen.run(stack.url, workload.requests, served_header=SERVED_HEADER, progress=progress))


def request_row(r: loadgen.Result, arrival: float, counted: bool) -> dict[str, Any]:
    """One request as the results JSON keeps it: its measures, when it arrived and whether the table counts it
    (arrivals after the warm-up)."""
    hit = r.cached_tokens / r.prompt_tokens if r.prompt_tokens else 0.0
    return {
        "arrival": round(arrival, 4), "counted": counted, "group": r.group, "status": r.status,
        "ttft": r.ttft, "e2e": r.e2e, "prompt_tokens": r.prompt_tokens, "cached_tokens": r.cached_tokens,
        "completion_tokens": r.completion_tokens, "hit": round(hit, 4), "served_by": r.served_by,
        **({"error": r.error} if r.error else {}),
    }  # fmt: skip


def summary_dict(s: loadgen.RunSummary, bound: float, cap_bound: float) -> dict[str, Any]:
    """`captured` is against the capacity bound (what the pods' caches could hold), `captured_inf` against the
    unlimited one."""
    d = s.as_dict()
    d["bound"], d["cap_bound"] = bound, cap_bound
    d["captured"] = s.kv_hit_rate / cap_bound if cap_bound > 0 else float("nan")
    d["captured_inf"] = s.kv_hit_rate / bound if bound > 0 else float("nan")
    return d


def start_sims(
    model: SimModel, pods: int, block_size: int, kv_tokens: int
) -> contextlib.AbstractContextManager[list[SimProcess]]:
    if ENGINE is not None:
        return engine_pool(ENGINE, model, pods, block_size, kv_tokens)
    hosts = loopback_hosts(pods)
    return start_simulators(
        pods,
        base_args=model.args(block_size, kv_tokens),
        per_sim_args=lambda i: (
            ["--seed", str(i)] + (["--pod-name", "sim-" + hosts[i].replace(".", "-")] if DISTINCT_HOSTS else [])
        ),
        timeout=180.0,  # a loaded 2-core machine can take a minute to load the tokenizers
        events=SIM_EVENTS,
        distinct_hosts=DISTINCT_HOSTS,
    )


def engine_values(model: SimModel, block_size: int, kv_tokens: int) -> dict[str, object]:
    """An engine's placeholders (e2e.harness.engines.ENGINE_KEYS) from the simulated pod's model: the same prefill
    rate, overhead, inter-token latency and batch size, at the same time scale."""
    ms = model.time_scale * 1000
    return {
        "model": MODEL, "block_size": block_size, "kv_blocks": max(8, kv_tokens // block_size),
        "max_num_seqs": model.max_num_seqs, "prefill_us_per_token": round(1e6 / model.effective_prefill_tps),
        "prefill_tps": round(model.effective_prefill_tps, 3),
        "prefill_overhead_ms": round(model.prefill_overhead * ms),
        "time_factor_under_load": model.time_factor_under_load,
        "inter_token_latency_ms": round(model.inter_token_latency * ms),
    }  # fmt: skip


@contextlib.contextmanager
def engine_pool(
    spec: EngineSpec, model: SimModel, pods: int, block_size: int, kv_tokens: int
) -> Iterator[list[SimProcess]]:
    """`pods` pods of another engine (--engine), restarted before every run (EnginePool.restart)."""
    with tempfile.TemporaryDirectory(prefix="pyepp-engine-") as d:
        pool = EnginePool(spec, pods, engine_values(model, block_size, kv_tokens), Path(d))
        try:
            pool.restart()
            yield cast(list[SimProcess], pool)  # the surface of a simulator the suite uses (e2e.harness.simconfig.Pod)
        finally:
            pool.close()


@contextlib.contextmanager
def render_server(model: SimModel, block_size: int) -> Iterator[str]:
    """One more simulator, outside the pool, for the EPPs that tokenize through vLLM's render API (llm-d's
    token-producer with `vllm.url`, as its precise-prefix guide's standalone render Service): sets RENDER_URL."""
    global RENDER_URL
    sim = start_simulator(model.args(block_size, 8192), events=False, replay=False, timeout=180.0)
    RENDER_URL = sim.url
    try:
        yield sim.url
    finally:
        RENDER_URL = ""
        sim.stop()


# --no-kv-events: the pods publish no KV events (the precise strategies find no publisher at their event port)
SIM_EVENTS = True
# Every pod on its own loopback address, all on the same ports, as pods in a cluster: an external EPP that finds the
# pods' KV events by pod discovery (llm-d: tcp://<pod ip>:<socketPort>) needs it. On when --external is given.
DISTINCT_HOSTS = False
RENDER_URL = ""  # render_server's, while it runs
ENGINE: EngineSpec | None = None  # --engine: the pods run this engine instead of e2e.sim
PICK_LOGS: Path | None = None  # --pick-logs: a pick log (e2e.harness.picklog) per run is written here


def _pick_log(workdir: Path) -> dict[str, object] | None:
    """Envoy's options for a stack in `workdir`: with --pick-logs, an access log of every pick."""
    return {"pick_log": str(workdir / "picks.access.log")} if PICK_LOGS else None


def write_picks(stack: Stack, dest: Path) -> None:
    """The stopped stack's picks (Envoy's access log) with each scorer's terms where its EPP logged them (an
    endpoints file beside the EPP's log names llm-d's endpoint ids), as a pick log at `dest`, and the EPP's log
    beside it."""
    access = Path(stack.envoy.opts.pick_log or "")
    if not access.is_file():
        log.warning("no access log for %s", dest.name)
        return
    picks = picklog.from_access_log(access)
    endpoints = stack.epp.log_path.parent / "endpoints.yaml"
    names = picklog.discovery_names(endpoints) if endpoints.is_file() else {}
    picklog.attach_terms(picks, picklog.terms_from_log(stack.epp.log_path, names))
    dest.parent.mkdir(parents=True, exist_ok=True)
    picklog.write(dest, picks)
    shutil.copyfile(stack.epp.log_path, dest.with_suffix(".epp.log"))  # what else the EPP said, for diagnosis


def pick_parity(out: Path, pairs: Sequence[tuple[str, str]], cells: Sequence[Cell]) -> str:
    """Per cell and pair (A, B): how often B made A's pick on the same replay, ties excepted, up to a renaming of
    idle pods and strictly (picklog.compare), the run of identical picks from the start, what decided the
    differences, and B's TTFT p90 over A's (both from that run)."""
    rows = ["| cell | A | B | picks | agreement (renamed / strict) | identical from the start | ties | decided by "
            "| p90 B / A |", "|---|---|---|---:|---:|---:|---:|---|---:|"]  # fmt: skip
    for c in cells:
        p90 = {s["label"]: s["ttft_p90"] for s in c.repeats[0]} if c.repeats else {}
        for a, b in pairs:
            fa, fb = (out / f"{c.workload}_{c.pods}_{c.block_size}_{x.replace('/', '_')}.jsonl" for x in (a, b))
            if not (fa.is_file() and fb.is_file()):
                continue
            pa, pb = picklog.read(fa), picklog.read(fb)
            cmp, strict = picklog.compare(pa, pb), picklog.compare(pa, pb, rename=False)
            why = ", ".join(f"{k} {n}" for k, n in cmp.decided_by.most_common(3)) or "-"
            ratio = p90[b] / p90[a] if p90.get(a) and p90.get(b) else float("nan")
            rows.append(
                f"| {c.workload} {c.pods}:{c.block_size} | {a} | {b} | {cmp.matched} | {cmp.agreement:.1%} / "
                f"{strict.agreement:.1%} | {cmp.prefix} | {cmp.ties} | {why} | {ratio:.2f} |"
            )
    return "\n".join(rows)


def run_cell(
    spec: WorkloadSpec,
    pods: int,
    block_size: int,
    strategies: Sequence[str],
    model: SimModel,
    scale: float,
    workdir: Path,
    raw_out: dict[str, Any],
    sims: Sequence[SimProcess] | None = None,
    repeats: int = 1,
    stacks: Stacks | None = None,
    then: str | None = None,
    draws: bool = False,
) -> Cell:
    """One workload at one pod count and block size, every strategy; `sims` (started with this block size and the
    workload's KV capacity) are reused when given, else started and stopped here. With `repeats` > 1 every
    strategy runs that many times and the cell's summaries are the medians; with `draws` repeat r runs the workload's
    draw r (another seed: a fixed draw's arrivals and groups are the same in every repeat, so only a new draw
    samples how they fall on the pods). `stacks` (over the same `sims`), when
    given, is used and left open, and during this cell's last run the stack of strategy `then` (the next cell's
    first) is started in it, so that start-up overlaps this cell too."""
    # one workload per draw: repeat r runs draw r with `draws`, else every repeat runs draw 0
    drawn = [
        counted_after(*model.timed(spec.make(pods, scale, d), spec.warmup)) for d in range(repeats if draws else 1)
    ]
    tok = shared_tokenizer()
    bounds: list[float] = []
    cap_bounds: list[float] = []
    draw_ids: list[list[list[int]]] = []
    avg_prompt = 0.0
    for w, warmup in reversed(drawn):  # draw 0 last: its prompt length is the one printed
        ids = [engine_ids(r, sims) if isinstance(sims, EnginePool) else prompt_ids(r, tok) for r in w.requests]
        draw_ids.insert(0, ids)
        bounds.insert(0, reuse_bound(w.requests, block_size, ids=ids, count_after=warmup).share)
        capacity = pods * spec.pod_blocks(block_size)
        cap_bounds.insert(0, capacity_bound(w.requests, block_size, capacity, ids=ids, count_after=warmup).share)
        avg_prompt = sum(map(len, ids)) / max(1, len(ids))
    workload, warmup = drawn[0]
    bound = statistics.median(bounds)
    cell = Cell(spec.name, pods, block_size, len(workload.requests), workload.duration, bound, workload.params,
                cap_bound=statistics.median(cap_bounds))  # fmt: skip
    cell.params["warmup_s"] = warmup
    if draws:
        cell.params["draws"] = repeats
    print(
        f"\n== {spec.name}: {pods} pods, block {block_size}: {len(workload.requests)} requests over "
        f"{workload.duration:.0f}s, {avg_prompt:.0f} prompt tokens avg, "
        f"reuse bound {bound:.1%} (capacity {cell.cap_bound:.1%}), KV {spec.kv_tokens} tokens/pod"
        + (f", {repeats} draws" if draws else ""),
        flush=True,
    )
    with contextlib.ExitStack() as stack:
        if sims is None:
            sims = stack.enter_context(start_sims(model, pods, block_size, spec.kv_tokens))
        if isinstance(sims, EnginePool):  # applied at each run's restart
            sims.kv_blocks = spec.pod_blocks(block_size)
        for sim in [] if isinstance(sims, EnginePool) else sims:  # this workload's KV capacity (the simulators
            # may have run another workload before)
            _post_ok(sim.url + "/admin/config", {"num_gpu_blocks": spec.pod_blocks(block_size)}, timeout=10)
        pod_names = [pod_name(s) for s in sims]
        if stacks is None:
            stacks = Stacks(sims, block_size, workdir, model)
            stack.callback(stacks.close)
        # each repeat starts the order one strategy later, so drift on the shared machine hits none of them
        # systematically
        order = [
            (rep, strategies[(i + rep) % len(strategies)]) for rep in range(repeats) for i in range(len(strategies))
        ]
        runs: list[dict[str, dict[str, Any]]] = [{} for _ in range(repeats)]
        started = stacks.pending(order[0][1])
        for k, (rep, strategy) in enumerate(order):
            t0 = time.monotonic()
            current = stacks.take(started)
            if k + 1 < len(order):
                started = stacks.prestart(order[k + 1][1])
            elif then is not None:
                stacks.prestart(then)
            workload, warmup = drawn[rep % len(drawn)]
            key = f"{spec.name}/{pods}/{block_size}/{strategy}" + (f"/{rep}" if rep else "")
            label = f"{spec.name} [{k + 1}/{len(order)}] {strategy}" + (f" (repeat {rep + 1})" if repeats > 1 else "")
            try:
                results, duration = run_strategy(strategy, current, sims, workload, label)
            finally:
                stacks.stop(current, PICK_LOGS / f"{key.replace('/', '_')}.jsonl" if PICK_LOGS else None)
            counted = [r for r, q in zip(results, workload.requests, strict=True) if q.arrival >= warmup]
            span = max(1e-9, duration - warmup)
            s = loadgen.summarize(strategy, counted, span, pod_names)
            runs[rep][strategy] = summary_dict(s, bounds[rep % len(bounds)], cap_bounds[rep % len(cap_bounds)])
            lost = lost_reuse(
                workload.requests, results, draw_ids[rep % len(drawn)], block_size, model.effective_prefill_tps, warmup
            )
            runs[rep][strategy].update(lost.shares())
            if ENGINE is not None and not ENGINE.cached_tokens:  # the engine reports no per-request hit: n/a
                runs[rep][strategy].update({k: float("nan") for k in NO_HIT_FIELDS})
            runs[rep][strategy]["wall_s"] = time.monotonic() - t0
            raw_out[key] = [
                request_row(r, q.arrival, q.arrival >= warmup) for r, q in zip(results, workload.requests, strict=True)
            ]
        for rep in range(repeats):
            cell.repeats.append([runs[rep][st] for st in strategies])
        cell.summaries = [median_summary([rep[i] for rep in cell.repeats]) for i in range(len(strategies))]
    print(table(cell), flush=True)
    return cell


# What a pool whose engine reports no per-request cached tokens cannot measure (the report says n/a)
NO_HIT_FIELDS = ("kv_hit_rate", "captured", "captured_inf", "lost_engine", "lost_slower", "lost_miss",
                 "captured_not_slower")  # fmt: skip
MEDIAN_FIELDS = ("ttft_p50", "ttft_p90", "ttft_p99", "ttft_mean", "e2e_p50", "throughput_rps", "output_tok_s",
                 "kv_hit_rate", "load_cv", "captured", "captured_inf", "wall_s", "lost_engine", "lost_slower",
                 "lost_miss", "captured_not_slower")  # fmt: skip


def median_summary(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One strategy's repeated runs of a cell as one summary: the median of every measure, ok/n summed."""
    out = dict(runs[0])
    for k in MEDIAN_FIELDS:
        vals = [r[k] for r in runs if k in r and r[k] == r[k]]
        out[k] = statistics.median(vals) if vals else float("nan")
    out["ok"], out["n"], out["runs"] = sum(r["ok"] for r in runs), sum(r["n"] for r in runs), len(runs)
    return out


def _ms(x: float) -> str:
    return "-" if x != x else f"{x * 1000:.0f}"


def table(cell: Cell) -> str:
    """The cell as a markdown table (printed as it is and written to results.md): medians when repeated."""
    cols = ["strategy", "ok/n", "TTFT p50 ms", "p90", "p99", "req/s", "KV hit", "bound: unlimited / capacity",
            "captured",
            "lost: slower / miss / engine", "pods CoV", "p90 vs best other"]  # fmt: skip
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for s in cell.summaries:
        others = [o["ttft_p90"] for o in cell.summaries if o["label"] != s["label"] and o["ttft_p90"] == o["ttft_p90"]]
        best = min(others, default=float("nan"))
        row = [
            s["label"], f"{s['ok']}/{s['n']}", _ms(s["ttft_p50"]), _ms(s["ttft_p90"]), _ms(s["ttft_p99"]),
            f"{s['throughput_rps']:.1f}", _pct(s["kv_hit_rate"], "n/a"),
            f"{s['bound']:.1%} / {_pct(s.get('cap_bound'))}",
            f"{s['captured']:.0%}" if s["captured"] == s["captured"] else _na(s), _lost(s), f"{s['load_cv']:.2f}",
            f"{s['ttft_p90'] / best:.2f}x" if best and best == best else "-",
        ]  # fmt: skip
        out.append("| " + " | ".join(row) + " |")
    return "\n".join(out)


def _pct(x: float | None, missing: str = "-") -> str:
    return missing if x is None or x != x else f"{x:.1%}"


def _na(s: dict[str, Any]) -> str:
    """A share the pool could not measure (no per-request cached tokens) reads n/a; one with nothing to share, -."""
    return "n/a" if s.get("kv_hit_rate") != s.get("kv_hit_rate") else "-"


def _lost(s: dict[str, Any]) -> str:
    """The bound's tokens not delivered, as shares of it, by why (affinity_trace.lost_reuse); '-' without reuse."""
    if s.get("bound", 0) <= 0 or "lost_miss" not in s:
        return "-"
    return " / ".join(_pct(s[k], "n/a") for k in ("lost_slower", "lost_miss", "lost_engine"))


def plot(path: Path, workload: str, cells: Sequence[Cell]) -> None:
    """One figure per workload: TTFT p50/p90/p99 per strategy (log scale), one panel per (pods, block size)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = [c for c in cells if c.workload == workload]
    if not cells:
        return
    fig, axes = plt.subplots(1, len(cells), figsize=(4.2 * len(cells) + 1, 4.2), dpi=100, squeeze=False)
    for ax, c in zip(axes[0], cells, strict=True):
        labels = [s["label"] for s in c.summaries]
        x = range(len(labels))
        for k, (q, alpha) in enumerate((("ttft_p50", 1.0), ("ttft_p90", 0.7), ("ttft_p99", 0.4))):
            vals = [max(1e-4, s[q]) * 1000 if s[q] == s[q] else 0 for s in c.summaries]
            ax.bar([i + (k - 1) * 0.27 for i in x], vals, width=0.27, alpha=alpha, label=q.replace("ttft_", ""),
                   color="tab:blue")  # fmt: skip
        ax.set_yscale("log")
        ax.set_xticks(list(x))
        ax.set_xticklabels(labels, rotation=40, ha="right", fontsize=8)
        ax.set_title(f"{c.pods} pods, block {c.block_size} (bound {c.bound:.0%})", fontsize=9)
        ax.grid(True, axis="y", which="both", alpha=0.3)
    axes[0][0].set_ylabel("TTFT ms (p50 / p90 / p99), log")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"{workload}: TTFT by routing strategy", fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def _other(label: str) -> bool:
    """Another strategy than ours (our variants are not others)."""
    return label != OURS and not label.startswith((OURS + "/", OURS + "@"))


def p90_by_repeat(cell: Cell) -> list[dict[str, float]]:
    """Each repeat's (a draw's, with --draws) TTFT p90 per strategy label, for ratios paired repeat by repeat."""
    return [{s["label"]: s["ttft_p90"] for s in rep} for rep in cell.repeats]


def goals(cells: Sequence[Cell]) -> str:
    """issue 11's goals for pyepp-default, per cell, from the numbers measured side by side."""
    rows = ["| cell | p90 vs best other (<= 1.0) | p90 vs llm-d-v0.10 (<= 0.9 on multi-turn, agentic) "
            "| p99 vs load (<= 1.05) | captured of the capacity bound (>= 90% on multi-turn, Mooncake; in brackets: "
            "of the unlimited bound where no holder was slower) "
            "| demo: p90 gain vs random (>= 50) / "
            "approximate (>= 5) |", "|---|---|---|---|---|---|"]  # fmt: skip
    for c in cells:
        by = {s["label"]: s for s in c.summaries}
        ours = by.get(OURS)
        if ours is None:
            continue
        others = [s["ttft_p90"] for k, s in by.items() if _other(k)]
        per_repeat = []  # paired: ours against the best other in the same repeat (a draw with --draws)
        for rep in p90_by_repeat(c) if len(c.repeats) > 1 else []:
            theirs = [v for k, v in rep.items() if _other(k)]
            if OURS in rep and theirs and min(theirs) > 0:
                per_repeat.append(f"{rep[OURS] / min(theirs):.2f}")

        def ratio(a: float, b: float | None) -> str:
            return f"{a / b:.2f}" if b else "-"

        llmd = by.get("llm-d-v0.10", {}).get("ttft_p90")
        load = by.get("load", {}).get("ttft_p99")
        demo = "-"
        if c.workload == "shared-prefix-demo":
            rnd, apx = by.get("random", {}).get("ttft_p90"), by.get("approximate", {}).get("ttft_p90")
            demo = f"{ratio(rnd or 0, ours['ttft_p90'])} / {ratio(apx or 0, ours['ttft_p90'])}"
        rows.append(
            f"| {c.workload} {c.pods}p/{c.block_size} | {ratio(ours['ttft_p90'], min(others, default=0))}"
            + (f" (per repeat {', '.join(per_repeat)})" if per_repeat else "")
            + " "
            f"| {ratio(ours['ttft_p90'], llmd)} | {ratio(ours['ttft_p99'], load)} "
            f"| {_captured(ours)} | {demo} |"
        )
    return "\n".join(rows)


def _captured(s: dict[str, Any]) -> str:
    c, free = s["captured"], s.get("captured_not_slower", float("nan"))
    if c != c:
        return "-"
    return f"{c:.0%}" + (f" ({free:.0%})" if free == free else "")


def markdown(cells: Sequence[Cell], command: str) -> str:
    out = [f"Command: {command if command.startswith('`') else f'`{command}`'}", ""]
    for c in cells:
        out.append(
            f"**{c.workload}, {c.pods} pods, block {c.block_size}** ({c.requests} requests over {c.duration:.0f} s, "
            f"reuse bound {c.bound:.1%}, capacity bound {_pct(c.cap_bound)})"
        )
        out.append("")
        out.append(table(c))
        out.append("")
    out += ["Goals (pyepp-default):", "", goals(cells), ""]
    return "\n".join(out)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m e2e.bench.routing.suite", description=__doc__.split("\n\n")[0])
    a = p.add_argument
    a("--workloads", default=",".join(WORKLOADS), help=f"comma list of {', '.join(WORKLOADS)}")
    a("--strategies", default="", help="comma list (default: every available strategy)")
    a("--pods", default="4,8", help="comma list of pod counts")
    a("--block-sizes", default="16,64", help="comma list of KV block sizes")
    a("--cells", default="", help="explicit pods:block list, e.g. 4:16,8:64 (overrides --pods/--block-sizes)")
    a("--scale", type=float, default=1.0, help="workload length factor (requests, sessions, duration)")
    a("--quick", action="store_true", help="scale 0.3, 4 pods, block 16")
    a("--out", default="e2e/out/bench-routing")
    a("--ours-params", default="", help="JSON: parameters overriding the shipped default's, prefill-cost-scorer's "
      'or "<plugin type>.<parameter>"')  # fmt: skip
    a("--report", default="", help="re-render results.md (in --out when several) and the plots from these "
      "results.json files (comma list), run nothing")  # fmt: skip
    a("--variants", default="", help='JSON {"name": {params}}: adds strategies pyepp-default/<name> (tuning)')
    a("--sources", default="", help="comma list of name@checkout: adds strategies pyepp-default@<name> (and "
      "pyepp-default/<variant>@<name>) running that checkout's EPP, an A/B of code in one run")  # fmt: skip
    a("--external", default="", help="comma list of name=spec.yaml: adds strategy <name>, another EPP run from the "
      "spec's command line and config (e2e/external/; docs/benchmarks.md says how)")  # fmt: skip
    a("--engine", default="", help="spec.yaml: the pods run another vLLM-compatible server from its command line "
      "instead of e2e.sim (e2e/external/llm-d-inference-sim.yaml)")  # fmt: skip
    a("--plots", default="", help="directory for the per-workload PNGs (default: --out)")
    a(
        "--pick-logs",
        default="",
        help="directory: one pick log per run (e2e.harness.picklog: each pick, its "
        "scores and terms; pyepp runs with --emit-endpoint-scores --v 5, an external EPP as its spec says)",
    )
    a("--pick-parity", default="", help="comma list of A:B strategy pairs compared pick by pick (with "
      "--pick-logs; the table goes to results.md)")  # fmt: skip
    a("--repeats", type=int, default=1, help="runs of every strategy per cell (the tables show medians)")
    a("--draws", action="store_true", help="repeat r runs the workload drawn with seed + r (Mooncake: another "
      "sample of conversations), not the same draw again")  # fmt: skip
    a("--no-kv-events", action="store_true", help="simulated pods publish no KV events (pods without a publisher)")
    a("--time-scale", type=float, default=SimModel.time_scale,
      help="the simulated pods' time scale (every modelled duration x this; arrivals follow)")  # fmt: skip
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    ns = parse_args(argv)
    if ns.report:  # one results.json, or several (runs split by cells, e.g. in parallel): one report
        docs = [json.loads(Path(f).read_text()) for f in ns.report.split(",")]
        done = [Cell(**c) for d in docs for c in d["cells"]]
        done.sort(key=lambda c: (list(WORKLOADS).index(c.workload), c.pods, c.block_size))
        where = Path(ns.out) if len(docs) > 1 else Path(ns.report).parent
        where.mkdir(parents=True, exist_ok=True)
        (where / "results.md").write_text(markdown(done, " + ".join(f"`{d['command']}`" for d in docs)))
        for w in dict.fromkeys(c.workload for c in done):
            plot(Path(ns.plots or where) / f"{w}.png", w, done)
        print(goals(done))
        return 0
    known = available_strategies()
    try:
        add_external(ns.external)
        set_engine(ns.engine)
    except (ValueError, RuntimeError) as e:
        print(e, file=sys.stderr)
        return 2
    known += list(EXTERNAL)
    if ns.variants:
        VARIANTS.update(json.loads(ns.variants))
        known += [f"{OURS}/{v}" for v in VARIANTS]
    for item in filter(None, (x.strip() for x in ns.sources.split(","))):
        name, _, tree = item.partition("@")
        if not name or not (Path(tree) / "epp" / "__init__.py").exists():
            print(f"--sources {item!r}: want name@checkout, a directory holding an epp package", file=sys.stderr)
            return 2
        SOURCES[name] = Path(tree)
    known += [f"{k}@{n}" for n in SOURCES for k in known if not _other(k)]
    strategies = [s.strip() for s in ns.strategies.split(",") if s.strip()] or known
    for s in strategies:
        if s not in known:
            print(f"unknown or unavailable strategy {s!r}; available: {', '.join(known)}", file=sys.stderr)
            return 2
    workloads = [w.strip() for w in ns.workloads.split(",") if w.strip()]
    for w in workloads:
        if w not in WORKLOADS:
            print(f"unknown workload {w!r}; choose from {', '.join(WORKLOADS)}", file=sys.stderr)
            return 2
    if ns.ours_params:
        OURS_OVERRIDES.update(json.loads(ns.ours_params))
    pairs = [tuple(x.split(":", 1)) for x in filter(None, (y.strip() for y in ns.pick_parity.split(",")))]
    for pair in pairs:
        if len(pair) != 2 or not set(pair) <= set(strategies):
            print(f"--pick-parity {':'.join(pair)!r}: want A:B, two of the strategies run", file=sys.stderr)
            return 2
    if pairs and not ns.pick_logs:
        print("--pick-parity needs --pick-logs DIR", file=sys.stderr)
        return 2
    if ns.pick_logs:
        global PICK_LOGS
        PICK_LOGS = Path(ns.pick_logs)
        PICK_LOGS.mkdir(parents=True, exist_ok=True)
    if ns.no_kv_events:
        global SIM_EVENTS
        SIM_EVENTS = False
    if ns.quick:
        ns.scale, ns.cells = 0.3, ns.cells or "4:16"
    if ns.cells:
        grid = [(int(a), int(b)) for a, b in (c.split(":") for c in ns.cells.split(","))]
    else:
        grid = [(int(p), int(b)) for p in ns.pods.split(",") for b in ns.block_sizes.split(",")]
    out = Path(ns.out)
    plots = Path(ns.plots) if ns.plots else out
    model = SimModel(time_scale=ns.time_scale)
    cells: list[Cell] = []
    raw: dict[str, Any] = {}
    command = "python -m e2e.bench.routing.suite " + " ".join(sys.argv[1:] if argv is None else argv)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="pyepp-bench-routing-") as tmp, contextlib.ExitStack() as render:
        if needs_render(strategies):
            render.enter_context(render_server(model, grid[0][1]))
        for pods, bs in grid:
            # one set of simulators per cell of the grid (starting them is slow on a loaded machine); each workload
            # sets its KV capacity through /admin/config
            with start_sims(model, pods, bs, max(WORKLOADS[w].kv_tokens for w in workloads)) as sims:
                for w in workloads:
                    cells.append(
                        run_cell(
                            WORKLOADS[w],
                            pods,
                            bs,
                            strategies,
                            model,
                            ns.scale,
                            Path(tmp),
                            raw,
                            sims,
                            ns.repeats,
                            draws=ns.draws,
                        )
                    )
                    _write(out, cells, raw, command, model)
        for w in workloads:
            plot(plots / f"{w}.png", w, cells)
    if PICK_LOGS and pairs:
        parity = pick_parity(PICK_LOGS, pairs, cells)
        print("\nPick parity:\n" + parity)
        with open(out / "results.md", "a") as f:
            f.write("\nPick parity (first repeat of each cell):\n\n" + parity + "\n")
    print(f"\n{len(cells)} cells, {len(strategies)} strategies in {time.monotonic() - t0:.0f}s; wrote {out}/results.*")
    failed = sum(s["n"] - s["ok"] for c in cells for s in c.summaries)
    if failed:
        print(f"{failed} requests failed", file=sys.stderr)
    return 0 if failed == 0 else 1


def set_engine(path: str) -> None:
    """--engine: the pods of every cell run this engine (e2e.harness.engines)."""
    global ENGINE
    if path:
        ENGINE = load_engine(Path(path))


def needs_render(strategies: Sequence[str]) -> bool:
    """Some external strategy tokenizes through a render server (its config names {render_url}) that the pool does
    not bring (an engine pool with its own tokenizer renders on a pod of its own)."""
    if ENGINE is not None:
        return False
    return any("{render_url}" in EXTERNAL[s].config for s in strategies if s in EXTERNAL)


def add_external(items: str) -> None:
    """--external: registers each spec as a strategy and puts the pods on their own addresses (pod discovery)."""
    global DISTINCT_HOSTS
    specs = checked_externals(items)
    EXTERNAL.update(specs)
    DISTINCT_HOSTS = DISTINCT_HOSTS or bool(specs)


def _write(out: Path, cells: Sequence[Cell], raw: dict[str, Any], command: str, model: SimModel) -> None:
    out.mkdir(parents=True, exist_ok=True)
    doc = {
        "command": command,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "sim_model": asdict(model),
        "workloads": {
            k: {"kv_tokens": v.kv_tokens, "warmup_s": v.warmup, "about": v.about} for k, v in WORKLOADS.items()
        },
        "cells": [asdict(c) for c in cells],
        "requests": raw,
    }
    (out / "results.json").write_text(json.dumps(doc))
    (out / "results.md").write_text(markdown(cells, command))


if __name__ == "__main__":
    raise SystemExit(main())
