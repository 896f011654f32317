"""The shipped example gateway config and the harness's generated configs pass `envoy --mode validate`; the example,
run as shipped in front of a dead and a live pod, retries the dead pod's requests on the live one."""

from __future__ import annotations

import re
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from e2e.harness.envoy_config import EnvoyOptions, write_bootstrap
from e2e.harness.http import post_json
from e2e.harness.ports import free_ports
from e2e.harness.procs import REPO_ROOT, EppProcess, _Process, envoy_binary
from e2e.sim.launch import start_in_thread

pytestmark = pytest.mark.e2e


def validate(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [envoy_binary(), "--mode", "validate", "-c", str(path), "--disable-hot-restart", "-l", "error"],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_example_bootstrap_validates() -> None:
    r = validate(REPO_ROOT / "config" / "envoy-bootstrap.yaml")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "OK" in r.stdout


@pytest.mark.parametrize("mode", ["FULL_DUPLEX_STREAMED", "BUFFERED"])
def test_generated_bootstrap_validates(tmp_path: Path, mode: str) -> None:
    opts = EnvoyOptions(18080, 18081, 18082, request_body_mode=mode, subset_listeners={18083: ["10.0.0.1"]},
                        pick_log=str(tmp_path / "picks.log"))  # fmt: skip
    r = validate(write_bootstrap(tmp_path / "envoy.json", opts))
    assert r.returncode == 0, r.stdout + r.stderr


def test_validate_rejects_a_broken_config(tmp_path: Path) -> None:
    """The check can fail: duplex without trailer mode SEND is rejected by Envoy itself."""
    text = (REPO_ROOT / "config" / "envoy-bootstrap.yaml").read_text()
    broken = tmp_path / "broken.yaml"
    broken.write_text(text.replace("request_trailer_mode: SEND", "request_trailer_mode: SKIP"))
    r = validate(broken)
    assert r.returncode != 0


LOG_FORMAT = (
    "%RESPONSE_CODE% %UPSTREAM_HOST% %RESPONSE_FLAGS% attempts=%UPSTREAM_REQUEST_ATTEMPT_COUNT% "
    "%RESPONSE_CODE_DETAILS% %UPSTREAM_TRANSPORT_FAILURE_REASON%"
)
ACCESS_LOG = """{indent}access_log:
{indent}  - name: envoy.access_loggers.file
{indent}    typed_config:
{indent}      "@type": type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog
{indent}      path: {path}
{indent}      log_format:
{indent}        text_format_source:
{indent}          inline_string: "{fmt}\\n"
"""


class ExampleEnvoy(_Process):
    """config/envoy-bootstrap.yaml as shipped, on free ports, its pool listing `pool_ports`; `retry=False` removes
    the route's retry policy (the control: without it a dead pod's requests fail)."""

    def __init__(self, tmp_path: Path, epp_port: int, pool_ports: list[int], retry: bool = True) -> None:
        text = (REPO_ROOT / "config" / "envoy-bootstrap.yaml").read_text()
        self.port, admin = free_ports(2)
        text = text.replace("port_value: 8081", f"port_value: {self.port}").replace("0.0.0.0", "127.0.0.1")
        text = text.replace("port_value: 19000", f"port_value: {admin}").replace(
            "port_value: 9002", f"port_value: {epp_port}"
        )
        for example, port in zip((8000, 8001), pool_ports, strict=True):
            text = text.replace(f"port_value: {example}}}", f"port_value: {port}}}")
        if not retry:
            text, n = re.subn(r"\n +retry_policy:\n(?: {30,}.*\n)+", "\n", text)
            assert n == 1
        # An access log beside the file as shipped: which pod each attempt went to and why one failed.
        self.access_log = tmp_path / f"access-{self.port}.log"
        text, n = re.subn(
            r"\n( +)stat_prefix: http\n",
            lambda m: m.group(0) + ACCESS_LOG.format(indent=m.group(1), path=self.access_log, fmt=LOG_FORMAT),
            text,
        )
        assert n == 1
        path = tmp_path / f"example-{self.port}.yaml"
        path.write_text(text)
        argv = [envoy_binary(), "-c", str(path), "--disable-hot-restart", "--concurrency", "1", "-l", "warning"]
        super().__init__("envoy", argv, tmp_path / f"envoy-{self.port}.log")
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{admin}/ready", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline or not self.running():
                raise self.fail("not ready")
            time.sleep(0.05)

    def logged(self, lines: int, timeout: float = 10.0) -> str:
        """The access log once it holds `lines` lines (Envoy flushes it about once a second)."""
        deadline = time.monotonic() + timeout
        while True:
            text = self.access_log.read_text() if self.access_log.exists() else ""
            if text.count("\n") >= lines or time.monotonic() > deadline:
                return text
            time.sleep(0.1)


@pytest.mark.parametrize("picks", [2, 1])
def test_example_bootstrap_retries_a_dead_pod_on_the_next_endpoint(tmp_path: Path, picks: int) -> None:
    """Two pods, the EPP's random picker is told never to drop a pod that fails its scrapes: once one pod is dead,
    half the picks name it first. Envoy retries those on the next address the EPP sent (maxNumOfEndpoints: 2) or,
    with no fallback sent (1), on another pod of the pool: every request succeeds; the same file without its retry
    policy answers 503s."""
    dead, live = start_in_thread([], events=False), start_in_thread([], events=False)
    cfg = tmp_path / "epp.yaml"
    cfg.write_text(
        f"plugins: [{{type: random-picker, parameters: {{maxNumOfEndpoints: {picks}}}}}]\n"
        "schedulingProfiles: [{name: default, plugins: [{pluginRef: random-picker}]}]\n"
        f"endpoints: [{{address: 127.0.0.1, port: {dead.http_port}}}, {{address: 127.0.0.1, port: {live.http_port}}}]\n"
    )
    flags = [
        "--secure-serving=true",
        "--health-checking",
        "--endpoint-max-scrape-failures=0",
        "--endpoint-stale-after=0",
    ]
    epp = EppProcess(cfg, tmp_path, extra_args=flags)
    envoys: list[ExampleEnvoy] = []
    try:
        epp.wait_ready(60)
        envoys = [
            ExampleEnvoy(tmp_path, epp.ports.grpc, [dead.http_port, live.http_port], retry=r) for r in (True, False)
        ]
        dead.stop()
        body = {"model": "Qwen/Qwen2.5-0.5B-Instruct", "prompt": "hello", "max_tokens": 1}
        statuses = {
            e.port: [post_json(f"http://127.0.0.1:{e.port}/v1/completions", body).status for _ in range(20)]
            for e in envoys
        }
        with_retry, without = statuses[envoys[0].port], statuses[envoys[1].port]
        log = envoys[0].logged(20)
        assert with_retry == [200] * 20, (with_retry, log)
        # The one retry a dead pick costs goes to the live pod: never a second attempt at the dead one.
        attempts = [int(a) for a in re.findall(r" attempts=(\d+) ", log)]
        assert len(attempts) == 20 and 2 in attempts and max(attempts) == 2, log
        assert 503 in without and 200 in without, without
    finally:
        for e in envoys:
            e.stop()
        epp.stop()
        live.stop()
        dead.stop()
