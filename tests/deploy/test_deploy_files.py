"""The deployment files in deploy/ are valid for the tools that consume them.

The systemd unit is checked by systemd itself (``systemd-analyze verify`` and the offline
security score); the container definition is checked for what this machine can check
without a registry: a numeric non-root user, and environment values imds accepts.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from imds.config import load

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
IMDS = Path(sys.executable).parent / "imds"
HARDENING = {
    "DynamicUser": "yes",
    "ProtectSystem": "strict",
    "CapabilityBoundingSet": "CAP_NET_BIND_SERVICE",
    "StateDirectory": "imds",
    "NoNewPrivileges": "yes",
}


def _unit_for_this_machine(tmp_path: Path) -> Path:
    """The shipped unit with ExecStart pointing at this checkout's imds (verify checks the binary exists)."""
    text = (DEPLOY / "systemd" / "imds.service").read_text()
    assert "ExecStart=/opt/imds/bin/imds serve" in text
    unit = tmp_path / "imds.service"
    unit.write_text(text.replace("/opt/imds/bin/imds", str(IMDS)))
    return unit


def _systemd_analyze() -> str:
    found = shutil.which("systemd-analyze")
    if found is None:
        pytest.fail("systemd-analyze is required (Debian package systemd; scripts/test installs it)")
    return found


def test_the_systemd_unit_passes_systemd_analyze_verify(tmp_path):
    """No error and no warning from systemd's own checker."""
    unit = _unit_for_this_machine(tmp_path)
    result = subprocess.run([_systemd_analyze(), "verify", str(unit)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "", result.stderr


def test_the_systemd_unit_is_hardened(tmp_path):
    """The directives the deployment relies on are there, and systemd rates the exposure low (< 2.0)."""
    unit = _unit_for_this_machine(tmp_path)
    directives = dict(
        line.split("=", 1) for line in unit.read_text().splitlines() if "=" in line and not line.startswith("#")
    )
    for key, value in HARDENING.items():
        assert directives.get(key) == value, key
    result = subprocess.run(
        [_systemd_analyze(), "security", "--offline=yes", str(unit)], capture_output=True, text=True, check=False
    )
    match = re.search(r"Overall exposure level for imds.service: ([0-9.]+)", result.stdout)
    assert match is not None, result.stdout + result.stderr
    assert float(match.group(1)) < 2.0, result.stdout


def test_the_container_runs_imds_serve_as_a_fixed_non_root_user():
    """USER is a numeric non-zero uid (Kubernetes' runAsNonRoot checks that), the entry point serves."""
    text = (DEPLOY / "container" / "Containerfile").read_text()
    users = re.findall(r"^USER\s+(\d+)(?::(\d+))?\s*$", text, flags=re.MULTILINE)
    assert users, "no numeric USER line"
    uid, gid = users[-1]
    assert int(uid) > 0
    assert not gid or int(gid) > 0
    assert 'ENTRYPOINT ["/opt/imds/bin/imds", "serve"]' in text
    # The image's environment is a configuration imds accepts as it is.
    env_block = re.search(r"^ENV (.+?)(?=^\S)", text, flags=re.MULTILINE | re.DOTALL)
    assert env_block is not None
    pairs = dict(re.findall(r"(IMDS_\w+)=(\S+)", env_block.group(1)))
    settings = load({}, environ=pairs)
    assert settings.listen == (("0.0.0.0", 8000),)  # noqa: S104 - a container listens on its own interface
    assert str(settings.data_dir) == "/var/lib/imds"
