"""Run the built container image for real (CI's image step; `make image-check`): `epp serve` from the image as its
non-root user with a static config, gRPC health and /metrics checked from outside, and one request routed through
Envoy (from the dev venv) to a simulated vLLM pod. Before that, the multimodal path runs inside the image: an image
chat in six image formats tokenized with the Qwen2.5-VL tokenizer (placeholders expanded, each image hashed as vLLM
hashes it), compared with the same code in the dev venv, so the image's slimming (stripped extension modules, Pillow
without fonts, transformers without model code) cannot silently break it.

    python -m e2e.image_check [--image localhost/pyepp:dev]

No Docker engine here: `buildah run --isolation chroot` runs the image's `epp` as uid 10001 with the host's network
(loopback), the config directory mounted read-only at /config. Prints one line per check; exits non-zero on the
first failure.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from e2e.harness.envoy_config import EnvoyOptions
from e2e.harness.http import post_json
from e2e.harness.ports import free_ports
from e2e.harness.procs import EnvoyProcess
from e2e.sim.launch import start_simulators
from epp.tokenization.multimodal import hash_image, inspect_image
from epp.tokenization.qwen import QWEN25_VL_MODEL, qwen25_vl_tokenizer_dir

IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "AVIF", "GIF", "TIFF")
PAD = 151655  # <|image_pad|>
IMAGE_TOKENS = (448 // 28) * (336 // 28)  # 192 for a 448x336 image (smart_resize keeps it)

# Runs in the image (argv: the tokenizer dir, the images dir, the model, the pad id): one JSON line per format.
MM_SCRIPT = """
import asyncio, base64, json, pathlib, sys
from epp.tokenization.prompt import HFBackend, PromptTokenizer
async def main(tokdir, imgdir, model, pad):
    pt = PromptTokenizer(HFBackend({}, default_dir=tokdir))
    for path in sorted(pathlib.Path(imgdir).iterdir()):
        url = "data:image/" + path.suffix[1:] + ";base64," + base64.b64encode(path.read_bytes()).decode()
        content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "Describe."}]
        r = await pt.tokenize_prompt(model, messages=[{"role": "user", "content": content}])
        (f,) = r.mm_features
        pads = r.token_ids.count(int(pad))
        print(json.dumps({"format": path.stem, "pads": pads, "hash": f.hash, "length": f.length}))
asyncio.run(main(*sys.argv[1:]))
"""


def multimodal_check(ctr: str, work: Path) -> None:
    """Tokenize an image chat inside the image, once per format; compare with the dev venv's hashes. (Run in the
    container the EPP then starts in: the bytecode it compiles under /cache is the EPP's too.)"""
    from PIL import Image

    mm = work / "mm"
    images, tok = mm / "images", mm / "tokenizer"
    images.mkdir(parents=True)
    shutil.copytree(qwen25_vl_tokenizer_dir(), tok)
    (mm / "check.py").write_text(MM_SCRIPT)
    want = {}
    for fmt in IMAGE_FORMATS:
        img = Image.new("RGB", (448, 336), (200, 20, 20))
        for x in range(0, 448, 7):
            img.putpixel((x, x % 336), (x % 256, 0, 255 - x % 256))
        buf = io.BytesIO()
        img.save(buf, fmt)
        (images / f"{fmt.lower()}.{fmt.lower()}").write_bytes(buf.getvalue())
        want[fmt.lower()] = hash_image(QWEN25_VL_MODEL, inspect_image(buf.getvalue()).media)
    for p in [mm, images, tok, *images.iterdir(), *tok.iterdir(), mm / "check.py"]:
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    r = subprocess.run(
        ["buildah", "run", "--isolation", "chroot", "--volume", f"{mm}:/mm:ro", ctr, "--",
         "python", "/mm/check.py", "/mm/tokenizer", "/mm/images", QWEN25_VL_MODEL, str(PAD)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    if r.returncode != 0:
        raise SystemExit(f"multimodal tokenization in the image failed:\n{r.stdout}\n{r.stderr[-3000:]}")
    got = {d["format"]: d for d in map(json.loads, r.stdout.splitlines())}
    for fmt, h in want.items():
        d = got.get(fmt)
        if d is None or d["hash"] != h or d["pads"] != IMAGE_TOKENS or d["length"] != IMAGE_TOKENS:
            raise SystemExit(f"multimodal {fmt} in the image: {d}, want hash {h} and {IMAGE_TOKENS} placeholders")
    print(f"ok: image chat tokenized in the image ({', '.join(IMAGE_FORMATS)}): mm hashes match, {IMAGE_TOKENS} pads")


def health(port: int, service: str = "readiness") -> int:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        return int(stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=1).status)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--image", default="localhost/pyepp:dev")
    ap.add_argument("--timeout", type=float, default=90.0, help="seconds for the EPP in the image to get ready")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="pyepp-image-check-"))
    os.chmod(work, 0o755)
    ctr = subprocess.run(["buildah", "from", args.image], check=True, capture_output=True, text=True).stdout.strip()
    grpc_port, health_port, metrics_port, listener, admin = free_ports(5)
    epp: subprocess.Popen[bytes] | None = None
    try:
        multimodal_check(ctr, work)
        with start_simulators(1, events=False, replay=False) as sims:
            sim = sims[0]
            confdir = work / "config"
            confdir.mkdir()
            (confdir / "epp.yaml").write_text(
                "endpoints:\n"
                f"  - {{name: sim0, address: 127.0.0.1, port: {sim.http_port}}}\n"
            )  # fmt: skip
            os.chmod(confdir, 0o755)
            os.chmod(confdir / "epp.yaml", 0o644)
            # `id -u` first: the process must run as the image's non-root user.
            argv = [
                "buildah", "run", "--isolation", "chroot", "--volume", f"{confdir}:/config:ro", ctr, "--",
                "sh", "-c", 'echo "uid=$(id -u)"; exec epp serve "$@"', "epp",
                "--config-file=/config/epp.yaml", "--bind-address=127.0.0.1", f"--grpc-port={grpc_port}",
                f"--grpc-health-port={health_port}", f"--metrics-port={metrics_port}", "--secure-serving=false",
                "--metrics-endpoint-auth=false",
            ]  # fmt: skip
            log_path = work / "epp.log"
            log = log_path.open("wb")
            epp = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            t0 = time.monotonic()
            while True:
                if epp.poll() is not None:
                    raise SystemExit(f"epp in the image exited with {epp.returncode}:\n{log_path.read_text()[-3000:]}")
                with contextlib.suppress(grpc.RpcError):
                    if health(health_port) == health_pb2.HealthCheckResponse.SERVING:
                        break
                if time.monotonic() - t0 > args.timeout:
                    raise SystemExit(f"epp in the image not SERVING after {args.timeout}s:\n{log_path.read_text()}")
                time.sleep(0.2)
            print(f"ok: gRPC health readiness SERVING after {time.monotonic() - t0:.1f} s")
            uid_line = next((ln for ln in log_path.read_text().splitlines() if ln.startswith("uid=")), "")
            if uid_line != "uid=10001":
                raise SystemExit(f"epp in the image runs as {uid_line!r}, want uid=10001")
            print("ok: runs as uid 10001")
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as r:
                text = r.read().decode()
            if "inference_extension_info" not in text:
                raise SystemExit("/metrics lacks inference_extension_info")
            print(f"ok: /metrics ({len(text)} bytes)")
            envoy = EnvoyProcess(EnvoyOptions(listener_port=listener, admin_port=admin, ext_proc_port=grpc_port), work)
            try:
                envoy.wait_ready()
                body = {"model": "Qwen/Qwen2.5-0.5B-Instruct", "prompt": "hello", "max_tokens": 2}
                r2 = post_json(envoy.url + "/v1/completions", body, timeout=60)
                if r2.status != 200 or int(r2.headers.get("x-inference-port", 0)) != sim.http_port:
                    raise SystemExit(f"request through Envoy: {r2.status} {r2.headers} {r2.body[:300]!r}")
                print(f"ok: request through Envoy → image EPP → simulator: {json.loads(r2.body)['usage']}")
            finally:
                envoy.stop()
    finally:
        if epp is not None and epp.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(epp.pid, signal.SIGTERM)
            try:
                epp.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(epp.pid, signal.SIGKILL)
                epp.wait(5)
        subprocess.run(["buildah", "rm", ctr], capture_output=True)
    size = subprocess.run(
        ["buildah", "images", "--format", "{{.Size}}", args.image], capture_output=True, text=True
    ).stdout.strip()
    print(f"image {args.image}: {size}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
