"""`epp serve` flags in a real process: TLS by default, --health-checking, TLS version and ciphers, cert reload,
pprof, metrics auth (TokenReview/SubjectAccessReview) and metrics TLS, and active-passive leader election on a Lease,
the last two against the fake API server."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from e2e.harness.procs import EppProcess
from tests.fakekube.server import INFERENCE_POOLS, LEASES, PODS, FakeKube, inference_pool, pod
from tests.fakekube.testing import write_kubeconfig

pytestmark = pytest.mark.e2e

SERVING = health_pb2.HealthCheckResponse.SERVING
EXT_PROC = "envoy.service.ext_proc.v3.ExternalProcessor"


# These tests are about flags and process behaviour, not routing: a light chain (GIE's queue scorer), so no
# tokenizer loads at start-up as with pyepp's default (which a config without plugins would run).
LIGHT = "plugins: [{type: queue-scorer}]\n"


def config(tmp_path: Path, text: str = LIGHT + "endpoints: []\n") -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    cfg = tmp_path / "epp.yaml"
    cfg.write_text(text)
    return cfg


LEADER_ONLY = LIGHT + "featureGates: [haPopulateNonLeaderDatastore=false]\nendpoints: []\n"


@contextlib.contextmanager
def epp(tmp_path: Path, *args: str, kit_defaults: bool = False, ready: bool = True) -> Iterator[EppProcess]:
    p = EppProcess(config(tmp_path), tmp_path, extra_args=list(args), kit_defaults=kit_defaults)
    try:
        if ready:
            p.wait_ready(60)
        yield p
    finally:
        p.stop()


def make_cert(d: Path, cn: str, key: str = "rsa:2048") -> Path:
    d.mkdir(parents=True, exist_ok=True)
    argv = ["openssl", "req", "-x509", "-nodes", "-days", "2", "-subj", f"/CN={cn}",
            "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
            "-keyout", str(d / "tls.key"), "-out", str(d / "tls.crt")]  # fmt: skip
    argv += ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"] if key == "ec" else ["-newkey", key]
    subprocess.run(argv, check=True, capture_output=True, timeout=60)
    return d


def handshake(port: int, *, max_version: ssl.TLSVersion | None = None, ciphers: str | None = None) -> str:
    """A TLS handshake (no verification, ALPN h2 as Envoy offers); returns the negotiated version or raises."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["h2"])
    if max_version is not None:
        ctx.maximum_version = max_version
    if ciphers is not None:
        ctx.set_ciphers(ciphers)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, ctx.wrap_socket(raw) as tls:
        return str(tls.version())


def peer_cn(port: int) -> str:
    pem = ssl.get_server_certificate(("127.0.0.1", port))
    out = subprocess.run(["openssl", "x509", "-noout", "-subject"], input=pem, capture_output=True, text=True)
    return out.stdout.strip()


def health_on(port: int, service: str, creds: grpc.ChannelCredentials | None = None) -> int:
    target = f"127.0.0.1:{port}"
    opts = [("grpc.ssl_target_name_override", "localhost")]
    with grpc.secure_channel(target, creds, options=opts) if creds else grpc.insecure_channel(target) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        return int(stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=3).status)


def test_ext_proc_serves_tls_by_default(tmp_path: Path) -> None:
    with epp(tmp_path, "--health-checking") as p:
        assert handshake(p.ports.grpc).startswith("TLS")
        with pytest.raises(grpc.RpcError):
            health_on(p.ports.grpc, EXT_PROC)  # plaintext to a TLS port fails
        cert = ssl.get_server_certificate(("127.0.0.1", p.ports.grpc)).encode()
        assert health_on(p.ports.grpc, EXT_PROC, grpc.ssl_channel_credentials(cert)) == SERVING
        assert p.health("readiness") == SERVING  # the probe port stays plaintext


def test_health_checking_flag_controls_the_ext_proc_port(tmp_path: Path) -> None:
    with epp(tmp_path, "--secure-serving=false") as p:
        with pytest.raises(grpc.RpcError) as e:
            health_on(p.ports.grpc, EXT_PROC)
        assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED  # the anchor's default: no health on ext_proc
    with epp(tmp_path, "--secure-serving=false", "--health-checking=true") as p:
        assert health_on(p.ports.grpc, EXT_PROC) == SERVING


def test_tls_min_version_13(tmp_path: Path) -> None:
    with epp(tmp_path, "--tls-min-version=VersionTLS13") as p:
        assert handshake(p.ports.grpc) == "TLSv1.3"
        with pytest.raises(ssl.SSLError):
            handshake(p.ports.grpc, max_version=ssl.TLSVersion.TLSv1_2)
    with epp(
        tmp_path / "ec", "--tls-min-version=VersionTLS13", f"--cert-path={make_cert(tmp_path / 'eccert', 'ec', 'ec')}"
    ) as p:
        assert handshake(p.ports.grpc) == "TLSv1.3"
        with pytest.raises(ssl.SSLError):
            handshake(p.ports.grpc, max_version=ssl.TLSVersion.TLSv1_2)
    with epp(tmp_path / "v12", "--tls-min-version=VersionTLS12") as p:
        assert handshake(p.ports.grpc, max_version=ssl.TLSVersion.TLSv1_2) == "TLSv1.2"


def test_tls_cipher_suites(tmp_path: Path) -> None:
    with epp(tmp_path, "--tls-cipher-suites=TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384") as p:
        v12 = ssl.TLSVersion.TLSv1_2
        assert handshake(p.ports.grpc, max_version=v12, ciphers="ECDHE-RSA-AES256-GCM-SHA384") == "TLSv1.2"
        with pytest.raises(ssl.SSLError):
            handshake(p.ports.grpc, max_version=v12, ciphers="ECDHE-RSA-AES128-GCM-SHA256")
        assert handshake(p.ports.grpc) == "TLSv1.3"  # TLS 1.3 suites are not configurable (as in Go)


def test_cert_reload(tmp_path: Path) -> None:
    certs = make_cert(tmp_path / "certs", "first")
    with epp(tmp_path, f"--cert-path={certs}", "--enable-cert-reload") as p:
        assert "CN = first" in peer_cn(p.ports.grpc) or "CN=first" in peer_cn(p.ports.grpc)
        new = make_cert(tmp_path / "next", "second")
        for name in ("tls.key", "tls.crt"):
            shutil.copy(new / name, certs / name)
        deadline = time.monotonic() + 10
        while "second" not in peer_cn(p.ports.grpc):
            assert time.monotonic() < deadline, "new certificate not served"
            time.sleep(0.1)
    certs = make_cert(tmp_path / "certs2", "fixed")
    with epp(tmp_path / "noreload", f"--cert-path={certs}") as p:
        new = make_cert(tmp_path / "next2", "changed")
        for name in ("tls.key", "tls.crt"):
            shutil.copy(new / name, certs / name)
        time.sleep(0.3)
        assert "fixed" in peer_cn(p.ports.grpc)  # without --enable-cert-reload the first pair stays


def get(
    url: str, token: str | None = None, timeout: float = 30, context: ssl.SSLContext | None = None
) -> tuple[int, str]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=context) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_pprof_endpoints(tmp_path: Path) -> None:
    with epp(tmp_path, "--secure-serving=false", "--metrics-endpoint-auth=false") as p:
        base = f"http://127.0.0.1:{p.ports.metrics}/debug/pprof/"
        status, text = get(base + "profile?seconds=0.5&hz=200")
        assert status == 200
        lines = [ln.rsplit(" ", 1) for ln in text.splitlines()]
        assert lines and sum(int(n) for _, n in lines) >= 50  # ~100 samples of the main thread alone
        # the serving loop's thread (uvloop's run_forever is not a Python frame; asyncio's Runner.run is, either way)
        assert any(stack.startswith("thread MainThread;") and "Runner.run" in stack for stack, _ in lines)
        status, text = get(base + "goroutine")
        assert status == 200 and "thread MainThread" in text and "task readiness" in text
        status, text = get(base + "heap?seconds=0.2")
        assert status == 200
        assert get(base + "profile?seconds=abc")[0] == 400
    with epp(tmp_path / "off", "--secure-serving=false", "--metrics-endpoint-auth=false", "--enable-pprof=false") as p:
        assert get(f"http://127.0.0.1:{p.ports.metrics}/debug/pprof/goroutine")[0] == 404
        assert get(f"http://127.0.0.1:{p.ports.metrics}/metrics")[0] == 200


@contextlib.asynccontextmanager
async def fake_kube() -> AsyncIterator[FakeKube]:
    kube = FakeKube()
    await kube.start()
    try:
        kube.create(INFERENCE_POOLS, inference_pool("pool", {"app": "sim"}, [8000]))
        kube.create(PODS, pod("p1", "127.0.0.9", {"app": "sim"}))
        yield kube
    finally:
        await kube.stop()


async def test_metrics_endpoint_auth_through_the_kubernetes_api(tmp_path: Path) -> None:
    async with fake_kube() as kube:
        kube.token_users = {
            "prom-token": {
                "username": "system:serviceaccount:monitoring:prometheus",
                "groups": ["system:authenticated"],
            },
            "nobody-token": {"username": "system:serviceaccount:default:nobody", "groups": ["system:authenticated"]},
        }
        kube.allowed = {("system:serviceaccount:monitoring:prometheus", "/metrics", "get")}
        args = ["--pool-name=pool", f"--kubeconfig={write_kubeconfig(kube, tmp_path)}", "--secure-serving=false"]
        p = EppProcess(config(tmp_path), tmp_path, extra_args=args, kit_defaults=False)
        try:
            await asyncio.to_thread(p.wait_ready, 60)
            url = f"http://127.0.0.1:{p.ports.metrics}/metrics"
            assert (await asyncio.to_thread(get, url))[0] == 401  # no token
            assert (await asyncio.to_thread(get, url, "bad-token"))[0] == 401
            assert (await asyncio.to_thread(get, url, "nobody-token"))[0] == 403
            status, text = await asyncio.to_thread(get, url, "prom-token")
            assert status == 200 and "inference_" in text
            pprof = f"http://127.0.0.1:{p.ports.metrics}/debug/pprof/goroutine"
            assert (await asyncio.to_thread(get, pprof, "prom-token"))[0] == 403  # authorized per path
            reviews = [r for r in kube.requests if r.path.endswith("subjectaccessreviews")]
            sent = len(reviews)
            assert (await asyncio.to_thread(get, url, "prom-token"))[0] == 200
            assert len([r for r in kube.requests if r.path.endswith("subjectaccessreviews")]) == sent  # cached
        finally:
            p.stop()
        # --metrics-endpoint-auth=false: open.
        p = EppProcess(
            config(tmp_path), tmp_path, extra_args=[*args, "--metrics-endpoint-auth=false"], kit_defaults=False
        )
        try:
            await asyncio.to_thread(p.wait_ready, 60)
            assert (await asyncio.to_thread(get, f"http://127.0.0.1:{p.ports.metrics}/metrics"))[0] == 200
        finally:
            p.stop()


def test_metrics_tls_with_client_certificates(tmp_path: Path) -> None:
    server = make_cert(tmp_path / "server", "metrics")
    client = make_cert(tmp_path / "client", "scraper")
    args = ["--secure-serving=false", f"--metrics-cert-dir={server}", f"--metrics-client-ca-file={client / 'tls.crt'}",
            "--metrics-endpoint-auth=false"]  # fmt: skip
    with epp(tmp_path, *args) as p:
        url = f"https://127.0.0.1:{p.ports.metrics}/metrics"
        ctx = ssl.create_default_context(cafile=str(server / "tls.crt"))
        with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
            get(url, context=ctx)  # no client certificate
        ctx.load_cert_chain(client / "tls.crt", client / "tls.key")
        status, text = get(url, context=ctx)
        assert status == 200 and "inference_" in text


async def wait_for(pred: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(pred):
        assert time.monotonic() < deadline, f"timed out: {what}"
        await asyncio.sleep(0.1)


def ready(p: EppProcess) -> bool:
    try:
        return p.health("readiness") == SERVING
    except grpc.RpcError:
        return False


async def test_leader_election_active_passive(tmp_path: Path) -> None:
    async with fake_kube() as kube:
        kubeconfig = write_kubeconfig(kube, tmp_path)
        args = ["--pool-name=pool", f"--kubeconfig={kubeconfig}", "--ha-enable-leader-election"]
        a = EppProcess(config(tmp_path, LEADER_ONLY), tmp_path, extra_args=args)
        b: EppProcess | None = None
        try:
            await asyncio.to_thread(a.wait_ready, 60)
            (lease,) = kube.objects(LEASES, "default")
            assert lease["metadata"]["name"] == "epp-default-pool.llm-d.ai"
            holder = lease["spec"]["holderIdentity"]
            assert holder and lease["spec"]["leaseDurationSeconds"] == 15
            b = EppProcess(config(tmp_path, LEADER_ONLY), tmp_path, extra_args=args)
            await asyncio.sleep(3)  # b is up, retries the held lease and stays a standby
            assert b.running() and not await asyncio.to_thread(ready, b)
            assert await asyncio.to_thread(ready, a)
            # Only the leader watches the pool.
            assert len({r.query.get("labelSelector") for r in kube.watch_requests("pods")}) == 1
            watches_before = len(kube.watch_requests("inferencepools"))
            # The leader renews the lease.
            rv = kube.objects(LEASES, "default")[0]["metadata"]["resourceVersion"]
            await wait_for(lambda: kube.objects(LEASES, "default")[0]["metadata"]["resourceVersion"] != rv, 5, "renew")
            # SIGTERM: the leader releases the lease, so the standby takes over in a retry period, not 15 s.
            t0 = time.monotonic()
            # Off the loop: the fake API server runs on it and must answer the release while `a` shuts down (a
            # blocking stop here held the release until `a` had exited, so the standby often waited out the lease).
            await asyncio.to_thread(a.stop, 40)
            await wait_for(lambda: ready(b), 10, "standby takes over")
            assert time.monotonic() - t0 < 10
            spec = kube.objects(LEASES, "default")[0]["spec"]
            assert spec["holderIdentity"] not in ("", holder) and spec["leaseTransitions"] == 1
            assert len(kube.watch_requests("inferencepools")) > watches_before  # the new leader watches now
        finally:
            a.stop()
            if b is not None:
                b.stop()


async def test_a_standby_populates_its_datastore_by_default(tmp_path: Path) -> None:
    """featureGates haPopulateNonLeaderDatastore (on by default, as llm-d-router): the standby watches the pool too,
    but stays not ready."""
    async with fake_kube() as kube:
        args = ["--pool-name=pool", f"--kubeconfig={write_kubeconfig(kube, tmp_path)}", "--ha-enable-leader-election"]
        a = EppProcess(config(tmp_path), tmp_path, extra_args=args)
        b: EppProcess | None = None
        try:
            await asyncio.to_thread(a.wait_ready, 60)
            watches_before = len(kube.watch_requests("inferencepools"))
            b = EppProcess(config(tmp_path), tmp_path, extra_args=args)
            await wait_for(lambda: len(kube.watch_requests("inferencepools")) > watches_before, 20, "standby watch")
            assert b.running() and not await asyncio.to_thread(ready, b)
        finally:
            a.stop()
            if b is not None:
                b.stop()


async def test_leader_loses_the_lease_and_exits(tmp_path: Path) -> None:
    async with fake_kube() as kube:
        args = ["--pool-name=pool", f"--kubeconfig={write_kubeconfig(kube, tmp_path)}", "--ha-enable-leader-election"]
        a = EppProcess(config(tmp_path), tmp_path, extra_args=args)
        try:
            await asyncio.to_thread(a.wait_ready, 60)
            # Another holder takes the lease over (as after a partition): renewals conflict and the leader gives up.
            lease = kube.objects(LEASES, "default")[0]
            lease["spec"]["holderIdentity"] = "someone-else"
            kube.update(LEASES, lease)
            code = await asyncio.to_thread(a.wait, 30)
            assert code == 1
            assert "leader election lost" in a.log_path.read_text()
        finally:
            a.stop()
