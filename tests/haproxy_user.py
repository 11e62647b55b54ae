"""The system user the agent's haproxy workers run as, created the way packaging creates it.

``ensure()`` runs ``systemd-sysusers`` on the shipped ``deploy/sysusers.d/imds-agent.conf``
when the user is missing (as ``scripts/ganeti.sh`` creates Ganeti's users), and fails the
test loudly when it cannot: a test that needs the user never skips.
"""

from __future__ import annotations

import grp
import pwd
import shutil
import subprocess
from pathlib import Path

import pytest

USER = "imds-haproxy"
SYSUSERS = Path(__file__).resolve().parents[1] / "deploy" / "sysusers.d" / "imds-agent.conf"


def ensure() -> str:
    """The user's name, once it and its group exist."""
    if not _present():
        tool = shutil.which("systemd-sysusers")
        if tool is None:
            pytest.fail("systemd-sysusers is required to create the agent's haproxy user (Debian package systemd)")
        # Idempotent and locked against concurrent user databases edits (other test runs may race here).
        done = subprocess.run([tool, str(SYSUSERS)], capture_output=True, text=True, timeout=60, check=False)
        if not _present():
            pytest.fail(f"could not create {USER}: {done.stdout}{done.stderr}")
    return USER


def _present() -> bool:
    try:
        pwd.getpwnam(USER)
        grp.getgrnam(USER)
    except KeyError:
        return False
    return True
