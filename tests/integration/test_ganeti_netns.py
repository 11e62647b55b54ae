"""Self-install in a network-namespace "instance": the example create script, fetched from imds, reads its parameters.

The test builds a netns joined to the root namespace by a veth pair on a /30 of
198.18.0.0/15 (the benchmarking range; nothing routes it), starts ``imds serve`` bound
to the root side, registers the guest's address, and runs inside the netns: curl fetches
``os/scripts/create`` from the service and the script runs, reading ``os/parameters.json``
and writing the ``OSP_<NAME>`` variables Ganeti would give it. Everything it creates is
removed by name; the server is stopped by PID.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from factories import new_id
from netns_guest import Guest, netns_guest, run
from serve_process import Server, serving

EXAMPLES = Path(__file__).parents[2] / "examples" / "ganeti-os"


@pytest.fixture
def guest() -> Iterator[Guest]:
    """A netns with one veth end (no loopback use inside); the other end in the root namespace."""
    with netns_guest("gt", 18) as made:
        yield made


def admin_of(server: Server) -> httpx.Client:
    """An admin client for ``server`` (no proxies from the environment)."""
    return httpx.Client(base_url=server.url, headers=server.admin_headers, timeout=10.0, trust_env=False)


def queue_install(server: Server, guest: Guest, message: bytes, **record: Any) -> str:
    """An instance at the guest's address with the OS record ``record`` and the host ``message`` queued; its id."""
    instance_id = new_id()
    metadata = {"id": instance_id, "ipAddresses": [guest.address], "metadata": {"id": instance_id}}
    server.post("/device-metadata", metadata)
    server.post("/device-os", {"id": instance_id, **record})
    with admin_of(server) as admin:
        assert admin.post(f"/device-messages/{instance_id}", content=message).status_code == 200
    return instance_id


def test_create_script_runs_in_the_instance_and_reads_its_parameters(tmp_path: Path, guest: Guest):
    """The guest fetches create from imds and runs it; it writes every OSP_<NAME> with the served values."""
    with serving(tmp_path, "--db", "memory://", "--os-definitions-dir", str(EXAMPLES), host=guest.host) as server:
        instance_id = queue_install(server, guest, b"proceed", os_type="tiny", mode="self_install", parameters={
            "hostname": {"value": "netns-guest", "visibility": "public"},
            "root-hash": {"value": "$6$salt$hash", "visibility": "private"},
            "root-password": {"value": "it's a secret", "visibility": "secret"},
        }, install_parameters={"disk": {"value": "/dev/vda", "visibility": "public"}})
        script = tmp_path / "create"
        fetched = guest.run("curl", "-fsS", "--max-time", "10", "-o", str(script),
                            f"{server.url}/ganeti/latest/os/scripts/create")
        assert fetched.returncode == 0, fetched.stderr
        assert script.read_bytes() == (EXAMPLES / "tiny" / "create").read_bytes()
        script.chmod(0o755)
        ran = guest.run("env", f"IMDS_URL={server.url}", f"TINY_OS_TARGET={tmp_path}", str(script))
        assert ran.returncode == 0, ran.stderr
        stranger = run("curl", "-sS", "--max-time", "10", f"{server.url}/ganeti/latest/os/parameters.json")
        assert stranger.stdout == "404 - Not Found"  # the root namespace is not the instance
        with admin_of(server) as admin:
            events = admin.get(f"/device-events/{instance_id}", params={"after": 0}).json()["events"]
        # the guest's "proceed" read consumed the message, and the success ended the install: 404
        assert guest.run("curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "10",
                         f"{server.url}/ganeti/latest/read").stdout == "404"
    assert [(e["state"], e["message"]) for e in events] == [
        ("running", "tiny: reading OS parameters"),
        ("succeeded", "tiny: installed with 4 parameters"),
        ("mode", "run"),  # the success ended the self_install: imds says so in the stream
    ]
    assert [e["cursor"] for e in events] == sorted({e["cursor"] for e in events})
    lines = (tmp_path / "ganeti-os.env").read_text().splitlines()
    assert lines == [
        "OSP_DISK=/dev/vda",
        "OSP_HOSTNAME=netns-guest",
        "OSP_ROOT_HASH='$6$salt$hash'",
        "OSP_ROOT_PASSWORD='it'\"'\"'s a secret'",
    ]


def test_create_script_stops_when_the_host_says_so(tmp_path: Path, guest: Guest):
    """A host message other than "proceed" stops the install: the script reports "failed" and writes nothing."""
    with serving(tmp_path, "--db", "memory://", "--os-definitions-dir", str(EXAMPLES), host=guest.host) as server:
        instance_id = queue_install(server, guest, b"hold", os_type="tiny", mode="install",
                                    parameters={"hostname": {"value": "held", "visibility": "public"}})
        with admin_of(server) as admin:
            script = tmp_path / "create"
            script.write_bytes((EXAMPLES / "tiny" / "create").read_bytes())
            script.chmod(0o755)
            ran = guest.run("env", f"IMDS_URL={server.url}", f"TINY_OS_TARGET={tmp_path}", str(script))
            assert ran.returncode == 1, ran.stderr
            events = admin.get(f"/device-events/{instance_id}", params={"after": 0}).json()["events"]
    assert [(e["state"], e["message"]) for e in events] == [("failed", "tiny: the host said 'hold', not 'proceed'")]
    assert not (tmp_path / "ganeti-os.env").exists()
