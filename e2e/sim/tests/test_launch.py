"""The subprocess launcher (`python -m e2e.sim` processes), as the demo, benchmarks and e2e tests use it."""

from __future__ import annotations

from e2e.sim.launch import start_simulators
from e2e.sim.testing import EventSubscriber

from .helpers import get, post


def test_start_simulators_on_distinct_hosts_with_pod_like_ports() -> None:
    with start_simulators(2, distinct_hosts=True, per_sim_args=lambda i: ["--max-num-seqs", str(3 + i)]) as sims:
        a, b = sims
        assert a.host != b.host and a.host.startswith("127.")
        assert a.http_port == b.http_port and a.event_port == b.event_port and a.replay_port == b.replay_port
        for i, s in enumerate(sims):
            assert s.alive() and get(s.url + "/health")[0] == 200
            _, state = post(s.url + "/admin/config", {})
            assert state["config"]["max_num_seqs"] == 3 + i
            assert s.event_endpoint == f"tcp://{s.host}:{s.event_port}"
            assert s.topic == f"kv@{s.host}:{s.http_port}@Qwen/Qwen2.5-0.5B-Instruct"
            sub = EventSubscriber(s.event_endpoint)
            try:
                status, _ = post(s.url + "/v1/completions", {"prompt": "hello " * 40, "max_tokens": 1})
                assert status == 200
                assert sub.recv().topic == s.topic.encode()
            finally:
                sub.close()
        procs = [s.proc for s in sims]
    assert all(p.poll() is not None for p in procs)
