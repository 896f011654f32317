"""ServeOptions.from_flags: where --metrics-endpoint-auth (default true) is in effect, and the startup warning
when it is not."""

from __future__ import annotations

import logging

import pytest

from epp.server.options import parse_options
from epp.server.runner import ServeOptions

WARNING = "--metrics-endpoint-auth is on by default but NOT in effect"


@pytest.mark.parametrize(
    ("argv", "kubernetes", "auth", "warned"),
    [
        ([], False, False, True),  # static endpoints / discovery file: open, and said loudly
        ([], True, True, False),  # a Kubernetes API: enforced
        (["--metrics-endpoint-auth=true"], False, True, False),  # asked for explicitly: enforced (needs the API)
        (["--metrics-endpoint-auth=false"], False, False, False),  # turned off: no warning
        (["--metrics-endpoint-auth=false"], True, False, False),
    ],
)
def test_metrics_auth_in_effect_or_said_off(
    caplog: pytest.LogCaptureFixture, argv: list[str], kubernetes: bool, auth: bool, warned: bool
) -> None:
    caplog.set_level(logging.WARNING, logger="epp.server.runner")
    options = ServeOptions.from_flags(parse_options(["--metrics-port=9191", *argv]), kubernetes=kubernetes)
    assert options.metrics_auth is auth
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(WARNING in m and "port 9191" in m for m in messages) is warned, messages
