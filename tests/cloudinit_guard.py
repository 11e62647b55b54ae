"""Running real cloud-init (Debian's, importable only by the system python) from the tests.

``GUEST_GUARD`` is code each script runs first: every connection leaves from the guest's
loopback source address (``cfg["source"]``) and only to the test server on 127.0.0.1, so
nothing can reach the real 169.254.169.254. ``run_cloud_init`` runs a script and returns
the JSON it printed last, failing (never skipping) when cloud-init is missing.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from serve_process import clean_env

SYSTEM_PYTHON = "/usr/bin/python3"

GUEST_GUARD = r"""
# Every connection leaves from the guest's loopback address, and only to the test server.
import urllib3.util.connection as _connection
_create = _connection.create_connection
def _from_guest(address, *args, **kwargs):
    if address[0] != "127.0.0.1":
        raise OSError(f"test guard: refusing to connect to {address[0]}")
    kwargs["source_address"] = (cfg["source"], 0)
    return _create(address, *args, **kwargs)
_connection.create_connection = _from_guest
"""


def run_cloud_init(script: str, cfg: dict[str, Any], tmp_path: Path, timeout: float) -> dict[str, Any]:
    """Run ``script`` with ``cfg`` as its argument under the system python; the JSON it printed last."""
    try:
        result = subprocess.run(
            [SYSTEM_PYTHON, "-c", script, json.dumps(cfg)],
            env=clean_env(tmp_path), capture_output=True, text=True, timeout=timeout, check=False,
        )
    except FileNotFoundError:
        pytest.fail(f"{SYSTEM_PYTHON} does not exist: cloud-init tests need Debian's python3 with cloud-init")
    if "No module named 'cloudinit" in result.stderr:
        pytest.fail(f"cloud-init is not importable by {SYSTEM_PYTHON} (apt-get install cloud-init):\n{result.stderr}")
    assert result.returncode == 0, result.stderr
    seen: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return seen
