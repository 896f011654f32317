"""TLS for the ext_proc port (GIE's `--secure-serving` / `--cert-path`): Envoy and Istio examples expect TLS to the
EPP and skip verification. `--cert-path DIR` loads DIR/tls.crt + DIR/tls.key; `--secure-serving` without a path makes
a self-signed pair once at startup with the `openssl` CLI (not on the request path).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import grpc


class TLSError(RuntimeError):
    pass


def load_credentials(cert_dir: str | Path) -> grpc.ServerCredentials:
    d = Path(cert_dir)
    try:
        cert = (d / "tls.crt").read_bytes()
        key = (d / "tls.key").read_bytes()
    except OSError as e:
        raise TLSError(f"cannot read tls.crt/tls.key in {d}: {e.strerror}") from None
    return grpc.ssl_server_credentials([(key, cert)])


def self_signed_dir(common_name: str = "pyepp") -> Path:
    """A temp dir holding a fresh self-signed tls.crt/tls.key (RSA 2048, 1 year)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise TLSError("--secure-serving without --cert-path needs the openssl CLI to make a self-signed certificate")
    d = Path(tempfile.mkdtemp(prefix="pyepp-tls-"))
    argv = [
        openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "365", "-subj", f"/CN={common_name}",
        "-keyout", str(d / "tls.key"), "-out", str(d / "tls.crt"),
    ]  # fmt: skip
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise TLSError(f"openssl failed: {r.stderr.strip()}")
    return d
