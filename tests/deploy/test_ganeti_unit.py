"""deploy/systemd/imds-ganeti-metad.service: imds in place of ganeti-metad, checked by systemd and by imds."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from imds.config import load

UNIT = Path(__file__).resolve().parents[2] / "deploy" / "systemd" / "imds-ganeti-metad.service"
IMDS = Path(sys.executable).parent / "imds"


def _analyze(*args: str) -> subprocess.CompletedProcess[str]:
    found = shutil.which("systemd-analyze")
    if found is None:
        pytest.fail("systemd-analyze is required (Debian package systemd; scripts/test installs it)")
    return subprocess.run([found, *args], capture_output=True, text=True, check=False)


def _directives() -> list[tuple[str, str]]:
    lines = UNIT.read_text().splitlines()
    return [(k, v) for line in lines if "=" in line and not line.startswith("#") for k, v in [line.split("=", 1)]]


def test_the_unit_passes_verify_and_is_hardened(tmp_path):
    """No error or warning from systemd-analyze verify; offline exposure below 2.0."""
    text = UNIT.read_text()
    assert "ExecStart=/opt/imds/bin/imds serve\n" in text
    unit = tmp_path / UNIT.name
    unit.write_text(text.replace("/opt/imds/bin/imds", str(IMDS)))
    verified = _analyze("verify", str(unit))
    assert (verified.returncode, verified.stderr.strip()) == (0, "")
    security = _analyze("security", "--offline=yes", str(unit))
    match = re.search(r"Overall exposure level for imds-ganeti-metad.service: ([0-9.]+)", security.stdout)
    assert match is not None, security.stdout + security.stderr
    assert float(match.group(1)) < 2.0


def test_the_unit_takes_metads_socket_and_pid_file():
    """The unit serves Ganeti's socket path, keeps the admin API on loopback, writes the PID file Ganeti checks."""
    directives = _directives()
    environ = dict(value.split("=", 1) for key, value in directives if key == "Environment")
    settings = load({}, environ=environ)
    assert str(settings.ganeti.ganeti_metad_socket) == "/run/ganeti/socket/ganeti-metad"
    assert settings.http.listen == (("169.254.169.254", 80),)
    assert settings.http.admin_listen == (("127.0.0.1", 8000),)
    # The node's OS definitions: Ganeti's search path, by default (no IMDS_OS_DEFINITIONS_DIR)
    assert settings.ganeti.os_definitions_dir is None
    assert [str(path) for path in settings.ganeti.ganeti_os_search_path] == [
        "/srv/ganeti/os", "/usr/local/lib/ganeti/os", "/usr/lib/ganeti/os", "/usr/share/ganeti/os"]
    posts = [value for key, value in directives if key == "ExecStartPost"]
    assert posts == ["+/bin/sh -c 'echo \"$MAINPID\" > /run/ganeti/ganeti-metad.pid'"]
    assert ("User", "gnt-metad") in directives
    assert ("SupplementaryGroups", "gnt-daemons") in directives
    assert ("ReadWritePaths", "/run/ganeti/socket") in directives
