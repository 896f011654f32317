"""A real kube-apiserver (k8s.io/kubernetes) over a real etcd on loopback, for the discovery tests: `make kube` builds
both from the Go module proxy (tools/kube/) into $KUBE_TOOLS. RBAC is on; an admin token is in a static token file;
the watch cache is off, so a watch resumed from a compacted revision gets `410 Gone` from etcd as in a cluster whose
history moved on. No controller-manager or scheduler runs: pods are created and their status patched by hand."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from e2e.harness.ports import free_ports

KUBE_VERSION = "v1.36.3"
ETCD_VERSION = "v3.7.3"
DEFAULT_DIR = Path.home() / ".cache" / "pyepp" / "tools" / f"kube-{KUBE_VERSION}-etcd-{ETCD_VERSION}"
ADMIN_TOKEN = "pyepp-test-admin-token"


def tools_dir() -> Path:
    d = Path(os.environ.get("KUBE_TOOLS") or DEFAULT_DIR)
    for name in ("kube-apiserver", "etcd"):
        if not (d / name).is_file():
            raise RuntimeError(f"{d / name} is missing: `make kube` builds kube-apiserver {KUBE_VERSION} and etcd")
    return d


@dataclass
class RealKube:
    url: str  # https://127.0.0.1:PORT
    etcd_url: str
    workdir: Path

    def kubeconfig(self, token: str, path: Path) -> str:
        """A kubeconfig for `token` (the serving certificate is self-signed: not verified)."""
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "real", "cluster": {"server": self.url, "insecure-skip-tls-verify": True}}],
            "users": [{"name": "u", "user": {"token": token}}],
            "contexts": [{"name": "real", "context": {"cluster": "real", "user": "u"}}],
            "current-context": "real",
        }
        path.write_text(yaml.safe_dump(doc))
        return str(path)

    def admin_kubeconfig(self) -> str:
        return self.kubeconfig(ADMIN_TOKEN, self.workdir / "admin.kubeconfig")

    def request(self, method: str, path: str, body: Any = None, *, token: str = ADMIN_TOKEN) -> tuple[int, Any]:
        """One REST call (JSON, or a merge patch for PATCH); (status, decoded body)."""
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        ctype = "application/merge-patch+json" if method == "PATCH" else "application/json"
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.url + path,
            data=data,
            method=method,
            headers={"Authorization": f"Bearer {token}", "Content-Type": ctype},
        )
        try:
            with urllib.request.urlopen(req, context=ctx, timeout=30) as r:
                return r.status, _decode(r.read())
        except urllib.error.HTTPError as e:
            return e.code, _decode(e.read())

    def ok(self, method: str, path: str, body: Any = None) -> Any:
        status, out = self.request(method, path, body)
        assert 200 <= status < 300, (method, path, status, out)
        return out

    def compact(self) -> int:
        """Compact etcd's history up to its current revision (etcd's v3 JSON gateway); returns the revision."""
        rev = int(self._etcd("/v3/kv/range", {"key": "AA=="})["header"]["revision"])
        self._etcd("/v3/kv/compaction", {"revision": str(rev), "physical": True})
        return rev

    def _etcd(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        req = urllib.request.Request(self.etcd_url + path, data=json.dumps(body).encode(), method="POST")
        with urllib.request.urlopen(req, timeout=10) as r:
            out: dict[str, Any] = json.loads(r.read())
            return out


def _decode(raw: bytes) -> Any:
    try:
        return json.loads(raw or b"null")
    except ValueError:
        return raw.decode(errors="replace")


def _openssl(*args: str) -> None:
    openssl = shutil.which("openssl")
    assert openssl, "the real API server tests need the openssl CLI (service-account keys)"
    subprocess.run([openssl, *args], check=True, capture_output=True, timeout=60)


@contextlib.contextmanager
def real_kube(timeout: float = 90.0) -> Iterator[RealKube]:
    tools = tools_dir()
    work = Path(tempfile.mkdtemp(prefix="pyepp-realkube-"))
    client, peer, secure = free_ports(3)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        etcd_log = open(work / "etcd.log", "wb")  # noqa: SIM115 (open while etcd runs)
        procs.append(
            subprocess.Popen(
                [
                    str(tools / "etcd"), "--name", "default", "--data-dir", str(work / "etcd"),
                    "--listen-client-urls", f"http://127.0.0.1:{client}",
                    "--advertise-client-urls", f"http://127.0.0.1:{client}",
                    "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                    "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                    "--initial-cluster", f"default=http://127.0.0.1:{peer}", "--log-level", "warn",
                ],
                stdout=etcd_log, stderr=subprocess.STDOUT,
            )
        )  # fmt: skip
        _openssl("genrsa", "-out", str(work / "sa.key"), "2048")
        _openssl("rsa", "-in", str(work / "sa.key"), "-pubout", "-out", str(work / "sa.pub"))
        (work / "tokens.csv").write_text(f'{ADMIN_TOKEN},admin,admin,"system:masters"\n')
        api_log = open(work / "kube-apiserver.log", "wb")  # noqa: SIM115
        procs.append(
            subprocess.Popen(
                [
                    str(tools / "kube-apiserver"), f"--etcd-servers=http://127.0.0.1:{client}",
                    "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={secure}",
                    f"--cert-dir={work / 'certs'}", f"--token-auth-file={work / 'tokens.csv'}",
                    "--authorization-mode=RBAC", "--service-cluster-ip-range=10.96.0.0/16",
                    "--service-account-issuer=https://kubernetes.default.svc",
                    f"--service-account-key-file={work / 'sa.pub'}",
                    f"--service-account-signing-key-file={work / 'sa.key'}",
                    "--watch-cache=false", "--disable-admission-plugins=ServiceAccount",
                    "--enable-priority-and-fairness=false", "--v=0",
                ],
                stdout=api_log, stderr=subprocess.STDOUT,
            )
        )  # fmt: skip
        kube = RealKube(f"https://127.0.0.1:{secure}", f"http://127.0.0.1:{client}", work)
        deadline = time.monotonic() + timeout
        while True:
            for p, name in zip(procs, ("etcd", "kube-apiserver"), strict=True):
                if p.poll() is not None:
                    log = (work / f"{name}.log").read_text()[-3000:]
                    raise RuntimeError(f"{name} exited with {p.returncode}:\n{log}")
            with contextlib.suppress(OSError, ValueError):
                if kube.request("GET", "/readyz")[0] == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("kube-apiserver not ready:\n" + (work / "kube-apiserver.log").read_text()[-3000:])
            time.sleep(0.3)
        yield kube
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in reversed(procs):
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(work, ignore_errors=True)
