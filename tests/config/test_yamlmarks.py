"""The config's YAML loader is strict where a slip would pass unseen, and says where (file:line)."""

from __future__ import annotations

from pathlib import Path

import pytest

from epp.config import ConfigError, load_config, parse_config
from epp.config.yamlmarks import MAX_INT_DIGITS, load_marked

HEAD = "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"


@pytest.mark.parametrize(
    ("body", "line", "why"),
    [
        ("poolName: a\npoolName: b\n", 4, "duplicate key 'poolName' (first at line 3)"),
        ("plugins:\n- type: queue-scorer\n  type: kv-cache-utilization-scorer\n", 5, "duplicate key 'type'"),
        ("plugins:\n- type: prefill-cost-scorer\n  parameters:\n    prefillTokensPerSecond: .nan\n", 6, "'.nan'"),
        ("plugins:\n- type: prefill-cost-scorer\n  parameters:\n    prefillTokensPerSecond: .inf\n", 6, "'.inf'"),
        ("plugins:\n- type: queue-scorer\n  parameters:\n    x: -1.0e+999\n", 6, "not a finite number"),
        ("refreshMetricsInterval: " + "5" * 5000 + "\n", 3, "integer of 5000 digits is out of range"),
    ],
)
def test_rejected_at_the_offending_line(body: str, line: int, why: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_config(HEAD + body, source="epp.yaml")
    msg = str(e.value)
    assert msg.startswith(f"epp.yaml:{line}: ") and why in msg, msg
    assert "Traceback" not in msg and "invalid YAML" not in msg


def test_merge_keys_may_be_overridden() -> None:
    doc = load_marked("base: &b {x: 1, y: 2}\nuse:\n  <<: *b\n  x: 3\n")
    assert doc["use"] == {"x": 3, "y": 2}


def test_long_but_reasonable_numbers_load() -> None:
    assert load_marked(f"x: {'9' * MAX_INT_DIGITS}\ny: 1.5e+300\n") == {"x": int("9" * MAX_INT_DIGITS), "y": 1.5e300}


def test_an_empty_file_is_an_error(tmp_path: Path) -> None:
    for text in ("", "\n# only a comment\n", "---\n"):
        f = tmp_path / "epp.yaml"
        f.write_text(text)
        with pytest.raises(ConfigError, match=rf"^{f}:1: the config is empty"):
            load_config(f)
    assert parse_config("").default_plugins  # programmatic empty text: the default config, as before
