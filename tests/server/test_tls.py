"""TLS credentials for the ext_proc server."""

from __future__ import annotations

from pathlib import Path

import pytest


def test_cert_path_without_files_is_a_clear_error(tmp_path: Path) -> None:
    from epp.server.tls import TLSError, load_credentials

    with pytest.raises(TLSError, match=r"tls\.crt/tls\.key"):
        load_credentials(tmp_path)
