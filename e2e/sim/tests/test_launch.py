"""The subprocess launcher (`python -m e2e.sim` processes), as the demo, benchmarks and e2e tests use it."""

from __future__ import annotations

from e2e.sim.launch import start_simulators
from e2e.sim.testing import EventSubscriber

from .helpers import get, post


def test_start_simulators_gives_distinct_healthy_processes() -> None:
    with start_simulators(2, per_sim_args=lambda i: ["--max-num-seqs", str(3 + i)]) as sims:
        assert len({s.http_port for s in sims}) == 2 and len({s.event_port for s in sims}) == 2
        for i, s in enumerate(sims):
            assert s.alive() and get(s.url + "/health")[0] == 200
            assert s.topic == f"kv@127.0.0.1:{s.http_port}@Qwen/Qwen2.5-0.5B-Instruct"
            _, state = post(s.url + "/admin/config", {})
            assert state["config"]["max_num_seqs"] == 3 + i
        sub = EventSubscriber(sims[1].event_endpoint or "")
        try:
            post(sims[1].url + "/v1/completions", {"prompt": "hello " * 40, "max_tokens": 1})
            assert sub.recv().topic == sims[1].topic.encode()
        finally:
            sub.close()
        procs = [s.proc for s in sims]
    assert all(p.poll() is not None for p in procs)
