"""TLS for the ext_proc port: `--secure-serving` (default true, as the anchors), `--cert-path DIR` (DIR/tls.crt and
DIR/tls.key, else a self-signed pair made once at startup with the `openssl` CLI), `--enable-cert-reload` (a new
pair in DIR is picked up by the next handshake), `--tls-cipher-suites` and `--tls-min-version`.

gRPC's Python API has no TLS version or cipher setting; its TLS stack reads the TLS 1.2 cipher list from
GRPC_SSL_CIPHER_SUITES once, so `grpc_tls_environment` computes that variable before grpc is first imported.
gRPC never negotiates below TLS 1.2; `VersionTLS13` is enforced by offering TLS 1.2 only cipher suites that the
server's key cannot use (ECDSA suites for an RSA key and the reverse), so every TLS 1.2 handshake fails while
TLS 1.3 (whose suites are not configurable, as in Go) is unaffected.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    import grpc

    from epp.server.options import Options

log = logging.getLogger(__name__)


class TLSError(RuntimeError):
    pass


def _read_pair(d: Path) -> tuple[bytes, bytes]:
    try:
        return (d / "tls.key").read_bytes(), (d / "tls.crt").read_bytes()
    except OSError as e:
        raise TLSError(f"cannot read tls.crt/tls.key in {d}: {e.strerror}") from None


def load_credentials(cert_dir: str | Path, *, reload: bool = False) -> grpc.ServerCredentials:
    import grpc

    d = Path(cert_dir)
    key, cert = _read_pair(d)
    if not reload:
        return grpc.ssl_server_credentials([(key, cert)])
    state: dict[str, Any] = {"stamp": _stamp(d)}

    def fetch() -> grpc.ServerCertificateConfiguration | None:
        """Called by gRPC for each new handshake: a new configuration when either file changed, else None."""
        stamp = _stamp(d)
        if stamp == state["stamp"]:
            return None
        try:
            new_key, new_cert = _read_pair(d)
        except TLSError as e:
            log.warning("cert reload: %s; keeping the current certificate", e)
            return None
        state["stamp"] = stamp
        log.info("cert reload: new certificate from %s", d)
        return grpc.ssl_server_certificate_configuration([(new_key, new_cert)])

    # gRPC's fetcher may return None ("unchanged"); the stub's type says otherwise.
    fetcher = cast(Callable[[], grpc.ServerCertificateConfiguration], fetch)
    return grpc.dynamic_ssl_server_credentials(grpc.ssl_server_certificate_configuration([(key, cert)]), fetcher)


def _stamp(d: Path) -> tuple[int, ...]:
    out: list[int] = []
    for name in ("tls.crt", "tls.key"):
        try:
            st = (d / name).stat()
            out += [st.st_mtime_ns, st.st_size, st.st_ino]
        except OSError:
            out += [0, 0, 0]
    return tuple(out)


def self_signed_dir(common_name: str = "pyepp") -> Path:
    """A temp dir holding a fresh self-signed tls.crt/tls.key (RSA 2048, 1 year)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise TLSError("--secure-serving without --cert-path needs the openssl CLI to make a self-signed certificate")
    d = Path(tempfile.mkdtemp(prefix="pyepp-tls-"))
    argv = [
        openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "365", "-subj", f"/CN={common_name}",
        "-addext", f"subjectAltName=DNS:{common_name},DNS:localhost,IP:127.0.0.1",
        "-keyout", str(d / "tls.key"), "-out", str(d / "tls.crt"),
    ]  # fmt: skip
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise TLSError(f"openssl failed: {r.stderr.strip()}")
    return d


def key_is_rsa(key_file: Path) -> bool:
    text = key_file.read_text(errors="replace")
    if "BEGIN RSA PRIVATE KEY" in text:
        return True
    if "BEGIN EC PRIVATE KEY" in text:
        return False
    openssl = shutil.which("openssl")
    if openssl is None:
        raise ValueError(f"--tls-min-version=VersionTLS13 needs the openssl CLI to read the key type of {key_file}")
    r = subprocess.run([openssl, "pkey", "-in", str(key_file), "-noout", "-text"], capture_output=True, text=True)
    if r.returncode != 0:
        raise ValueError(f"cannot read {key_file}: {r.stderr.strip()}")
    return "modulus" in r.stdout


def grpc_tls_environment(opts: Options) -> dict[str, str]:
    """GRPC_SSL_CIPHER_SUITES for --tls-cipher-suites / --tls-min-version (empty when neither is given)."""
    from epp.server.options import GO_CIPHER_SUITES

    if not opts.secure_serving and not opts.cert_path:
        return {}
    if opts.tls_min_version == "VersionTLS13":
        rsa = True  # the self-signed pair is RSA
        if opts.cert_path:
            rsa = key_is_rsa(Path(opts.cert_path) / "tls.key")
        unusable = "ECDHE-ECDSA-AES128-GCM-SHA256" if rsa else "ECDHE-RSA-AES128-GCM-SHA256"
        return {"GRPC_SSL_CIPHER_SUITES": unusable}
    names = [GO_CIPHER_SUITES[n.strip()] for n in opts.tls_cipher_suites if n.strip()]
    suites = [n for n in names if n]
    if not suites:
        return {}
    return {"GRPC_SSL_CIPHER_SUITES": ":".join(suites)}
