"""deploy/ for a hypervisor: the imds-agent and imds-proxy@ units and the haproxy user's sysusers.d file.

Checked by systemd itself (``systemd-analyze verify`` and the offline security score), by
``systemd-sysusers`` (the user it creates, into a scratch root), and by imds (the settings the
units give resolve to what the deployment section of docs/hypervisor.md says).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from imds.config import load_agent, load_proxy

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
IMDS = Path(sys.executable).parent / "imds"
# The ceiling of systemd's exposure score for each unit: the proxy needs one capability; the
# agent programs the host's network (NET_ADMIN, SYS_ADMIN for the metadata namespace) as root.
EXPOSURE = {"imds-agent.service": 3.5, "imds-proxy@.service": 2.0}


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is required (Debian package systemd; scripts/test installs it)")
    return found


def _unit(tmp_path: Path, name: str) -> Path:
    """The shipped unit with ExecStart pointing at this checkout's imds (verify checks the binary exists)."""
    text = (DEPLOY / "systemd" / name).read_text()
    command = "agent" if name.startswith("imds-agent") else "proxy"
    assert f"ExecStart=/opt/imds/bin/imds {command}\n" in text
    unit = tmp_path / name.replace("@.", "@net1.")
    unit.write_text(text.replace("/opt/imds/bin/imds", str(IMDS)))
    return unit


def _directives(name: str) -> list[tuple[str, str]]:
    lines = (DEPLOY / "systemd" / name).read_text().splitlines()
    return [(k, v) for line in lines if "=" in line and not line.startswith("#") for k, v in [line.split("=", 1)]]


@pytest.mark.parametrize("name", sorted(EXPOSURE))
def test_the_unit_passes_verify_and_is_hardened(tmp_path, name):
    """No error or warning from systemd-analyze verify; the offline exposure under the unit's ceiling."""
    unit = _unit(tmp_path, name)
    verified = subprocess.run([_tool("systemd-analyze"), "verify", str(unit)], capture_output=True, text=True,
                              check=False, timeout=60)
    assert (verified.returncode, verified.stderr.strip()) == (0, "")
    security = subprocess.run([_tool("systemd-analyze"), "security", "--offline=yes", str(unit)],
                              capture_output=True, text=True, check=False, timeout=60)
    match = re.search(rf"Overall exposure level for {re.escape(unit.name)}: ([0-9.]+)", security.stdout)
    assert match is not None, security.stdout + security.stderr
    assert float(match.group(1)) < EXPOSURE[name], security.stdout


def test_the_agent_unit_keeps_root_to_the_capabilities_the_datapath_needs():
    """A bounded set of capabilities, the host key as a credential, the state directory, SIGTERM to the agent alone."""
    directives = _directives("imds-agent.service")
    caps = set(dict(directives)["CapabilityBoundingSet"].split())
    assert caps == {"CAP_NET_ADMIN", "CAP_NET_BIND_SERVICE", "CAP_SYS_ADMIN", "CAP_SETUID", "CAP_SETGID",
                    "CAP_SYS_CHROOT"}
    assert ("LoadCredential", "host.key:/etc/imds/host.key") in directives
    assert ("KillMode", "mixed") in directives
    assert ("NoNewPrivileges", "yes") in directives
    assert ("ProtectSystem", "strict") in directives
    environ = {k: v.replace("%S", "/var/lib").replace("%d", "/run/credentials/imds-agent.service")
               for k, v in (value.split("=", 1) for key, value in directives if key == "Environment")}
    settings = load_agent({}, {**environ, "IMDS_AGENT_UPSTREAM": "https://imds.internal:8443",
                               "IMDS_AGENT_HOST_NAME": "compute-7"})
    assert settings.host_key_file == Path("/run/credentials/imds-agent.service/host.key")
    assert settings.shared_secret_file is None
    assert settings.state_dir == Path("/var/lib/imds/agent")
    assert settings.meta_netns == "imds-meta"
    assert ("ExecStartPre", "-+/usr/bin/ip netns add imds-meta") in directives


def test_the_proxy_unit_runs_in_its_networks_namespace_as_a_transient_user():
    """DynamicUser with port 80 only, inside /run/netns/%i, its host key a credential it alone can read."""
    directives = _directives("imds-proxy@.service")
    assert ("DynamicUser", "yes") in directives
    assert ("CapabilityBoundingSet", "CAP_NET_BIND_SERVICE") in directives
    assert ("NetworkNamespacePath", "/run/netns/%i") in directives
    environ = {k: v.replace("%d", "/run/credentials/imds-proxy@net1.service")
               for k, v in (value.split("=", 1) for key, value in directives if key == "Environment")}
    settings = load_proxy({}, {**environ, "IMDS_PROXY_UPSTREAM": "https://imds.internal:8443",
                               "IMDS_PROXY_HOST_NAME": "compute-7", "IMDS_PROXY_MAP": "/etc/imds/net1.map"})
    assert settings.host_key_file == Path("/run/credentials/imds-proxy@net1.service/host.key")


def test_sysusers_creates_the_haproxy_user_and_group(tmp_path):
    """The shipped sysusers.d file makes imds-haproxy (a system user, no login) and its group."""
    (tmp_path / "etc").mkdir()
    done = subprocess.run([_tool("systemd-sysusers"), f"--root={tmp_path}", str(DEPLOY / "sysusers.d" /
                                                                                "imds-agent.conf")],
                          capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 0, done.stderr
    [user] = [line.split(":") for line in (tmp_path / "etc" / "passwd").read_text().splitlines()
              if line.startswith("imds-haproxy:")]
    assert int(user[2]) < 1000  # a system user
    assert user[6] == "/usr/sbin/nologin"
    assert any(line.startswith("imds-haproxy:") for line in (tmp_path / "etc" / "group").read_text().splitlines())
