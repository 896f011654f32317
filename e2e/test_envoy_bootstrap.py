"""The shipped example gateway config and the harness's generated configs pass `envoy --mode validate`."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from e2e.harness.envoy_config import EnvoyOptions, write_bootstrap
from e2e.harness.procs import REPO_ROOT, envoy_binary

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
