"""A real one-node Ganeti cluster pushing to imds: Ganeti's own daemons, not its client library.

As root, with Debian's ``ganeti`` package (fails loudly otherwise, never skips). ``ganeti_cluster.py``
builds the isolated cluster (``gnt-cluster init``, the fake hypervisor, file and diskless disk
templates, the instance communication network) and runs ``imds serve`` on Ganeti's metad socket.
``gnt-instance add --communication=yes`` then makes Ganeti's master and node daemons run the
OS definition's ``create`` on the node (a trusted OS) and push the instance to imds; the test
asserts what imds stored, what the instance reads from its communication address, and runs the
same ``create`` inside the instance from imds (``imds-guest ganeti install``) to compare the
environment imds serves with the one Ganeti gave it on the node. One cluster for the module
(its init takes ~30 s); each test uses its own instance.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from ganeti_cluster import Cluster, NamespacedServer, ganeti_cluster, imds_as_metad, instance_netns
from guest_zipapp import build_documented_zipapp
from netns_guest import Guest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SYSTEM_PYTHON = "/usr/bin/python3"
OS_NAME = "imds-test"
# Writes the environment it is given onto the first disk, sorted, then a line END (1<>: the disk file
# keeps its size). Ganeti runs it on the node; imds-guest runs it inside the instance.
CREATE = """#!/bin/sh
set -eu
{ env | LC_ALL=C sort; echo END; } 1<> "$DISK_0_PATH"
"""
GREETING, ROOT_HASH, ROOT_PASSWORD = "hello from gnt-instance add", "$6$salt$hash", "s3cret-canary"
# What Ganeti gives a script on the node and a push does not carry (docs/ganeti.md, the
# os/environment table): the disks' details (Ganeti 3.0 pushes their UUIDs), the cluster's
# default hv/be parameters (it pushes the instance's own overrides, here none), the network's
# details (no netinfo in a push), the secondary nodes.
NOT_IN_A_PUSH = {
    "DISK_0_ACCESS", "DISK_0_BACKEND_TYPE", "DISK_0_SIZE", "INSTANCE_SECONDARY_NODES",
    "INSTANCE_BE_always_failover", "INSTANCE_BE_auto_balance", "INSTANCE_BE_maxmem", "INSTANCE_BE_minmem",
    "INSTANCE_BE_spindle_use", "INSTANCE_BE_vcpus", "INSTANCE_HV_migration_mode",
    "NIC_0_NETWORK_MAC_PREFIX", "NIC_0_NETWORK_NAME", "NIC_0_NETWORK_SUBNET", "NIC_0_NETWORK_SUBNET6",
    "NIC_0_NETWORK_TAGS",
}


@dataclass(frozen=True)
class Instance:
    """An instance Ganeti created: its UUID, communication address, disk file (host path), add's output."""

    name: str
    uuid: str
    address: str
    disk: Path | None
    output: str


def os_definition(os_dir: Path) -> None:
    """``/srv/ganeti/os/imds-test``: a trusted OS (it has ``create``) with three declared parameters."""
    definition = os_dir / OS_NAME
    definition.mkdir()
    for name, script in (("create", CREATE), ("export", "#!/bin/sh\n"), ("import", "#!/bin/sh\n"),
                         ("rename", "#!/bin/sh\n"), ("verify", "#!/bin/sh\n")):
        (definition / name).write_text(script)
        (definition / name).chmod(0o755)
    (definition / "ganeti_api_version").write_text("20\n")
    (definition / "parameters.list").write_text("greeting public\nroot-hash private\nroot-password secret\n")


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    base = Path(tempfile.mkdtemp(prefix="gcl-"))
    try:
        with ganeti_cluster(base) as made:
            os_definition(made.os_dir)
            yield made
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def imds(cluster: Cluster) -> Iterator[NamespacedServer]:
    with imds_as_metad(cluster) as server:
        yield server


def add(cluster: Cluster, name: str, *template: str) -> Instance:
    """``gnt-instance add --communication=yes`` with one public, one private and one secret OS parameter."""
    output = cluster.gnt(
        "gnt-instance", "add", *template, "--communication=yes", "--no-nics", "-o", OS_NAME, "--hypervisor", "fake",
        "-n", "node1", "--no-name-check", "--no-ip-check", "-O", f"greeting={GREETING}",
        "--os-parameters-private", f"root-hash={ROOT_HASH}", "--os-parameters-secret", f"root-password={ROOT_PASSWORD}",
        name)
    listed = cluster.gnt("gnt-instance", "list", "--no-headers", "--separator=|", "-o", "uuid,nic.ips,nic.names",
                         name)
    uuid, address, nic_names = listed.strip().split("|")
    assert nic_names == f"['ganeti:communication:{name}']", listed  # the one NIC --communication=yes added
    disks = sorted((cluster.base / "srv" / "ganeti" / "file-storage" / name).glob("*.disk0"))
    return Instance(name, uuid, address, disks[0] if disks else None, output)


@pytest.fixture(scope="module")
def inst1(cluster: Cluster, imds: NamespacedServer) -> tuple[Instance, dict[str, str]]:
    """A file-disk instance, and the environment Ganeti's run of ``create`` on the node wrote onto its disk."""
    instance = add(cluster, "inst1", "-t", "file", "--disk", "0:size=16M")
    assert instance.disk is not None
    return instance, written_environment(instance.disk)


def written_environment(disk: Path) -> dict[str, str]:
    """The environment ``create`` wrote at the start of ``disk``."""
    text = disk.read_bytes().split(b"END\n", 1)[0].decode()
    return dict(line.split("=", 1) for line in text.splitlines())


def admin(server: NamespacedServer, path: str) -> dict[str, Any]:
    with httpx.Client(timeout=10.0, trust_env=False) as client:
        answer = client.get(f"{server.url}{path}", headers=server.admin_headers)
    assert answer.status_code == 200, answer.text
    result: dict[str, Any] = answer.json()
    return result


def read(guest: Guest, path: str) -> tuple[int, str]:
    """GET ``path`` from 169.254.169.254 inside the instance's namespace: (status, body)."""
    done = guest.run("curl", "-sS", "-m", "20", "-w", "\n%{http_code}", f"http://{guest.host}{path}")
    assert done.returncode == 0, done.stderr
    body, status = done.stdout.rsplit("\n", 1)
    return int(status), body


def test_the_node_daemon_pushes_the_instance_to_imds(cluster, imds, inst1):
    """Ganeti's node daemon found imds's PID alive, pushed to its socket, and never started ganeti-metad."""
    instance, _ = inst1
    assert "Could not update metadata" not in instance.output  # UpdateMetadata's warning when the push fails
    assert re.search(r"POST /instance_metadata_modify HTTP/1\.1 200", (cluster.base / "log" / "node-daemon.log")
                     .read_text()), cluster.logs()
    assert not cluster.metad_started()
    programs = {Path(arg).name for argv in cluster.processes() for arg in argv[:2]}  # python3 runs noded
    assert "ganeti-noded" in programs, programs
    assert "ganeti-metad" not in programs, programs
    metadata = admin(imds, f"/device-metadata/{instance.uuid}")
    assert metadata["hostname"] == "inst1"
    pushed = metadata["ganeti"]
    assert (pushed["name"], pushed["os"], pushed["hypervisor"]) == ("inst1", OS_NAME, "fake")
    assert pushed["communication_ip"] == instance.address
    assert [(nic["name"], nic["ip"]) for nic in pushed["nics"]] == [("ganeti:communication:inst1", instance.address)]
    record = admin(imds, f"/device-os/{instance.uuid}")
    assert (record["os_type"], record["mode"], record["communication"]) == (OS_NAME, "run", True)
    assert record["parameters"] == {
        "greeting": {"visibility": "public", "value": GREETING},
        "root-hash": {"visibility": "private", "value": "<private>"},
        "root-password": {"visibility": "secret", "secret_state": "held"},
    }
    stored = sorted((cluster.base / "imds").glob("imds.db*"))  # with -wal and -shm
    assert stored
    assert not [path for path in stored if ROOT_PASSWORD.encode() in path.read_bytes()]


def test_the_instance_reads_what_ganeti_pushed(cluster, imds, inst1):
    """From the address Ganeti gave its communication NIC: its parameters, the OS script, another flavor."""
    instance, _ = inst1
    with instance_netns(cluster, instance.address) as guest:
        status, body = read(guest, "/ganeti/latest/os/parameters.json")
        assert status == 200, body
        assert json.loads(body) == {"greeting": [GREETING, "public"], "root-hash": [ROOT_HASH, "private"],
                                    "root-password": [ROOT_PASSWORD, "secret"]}
        assert read(guest, "/ganeti/latest/os/scripts/create") == (200, CREATE)  # the node's file, byte for byte
        assert read(guest, "/latest/meta-data/hostname") == (200, "inst1")


def test_the_os_create_script_runs_against_imds(cluster, imds, inst1, tmp_path):
    """``create`` from imds inside the instance gets what Ganeti gave it on the node, less what a push lacks."""
    instance, on_node = inst1
    assert instance.disk is not None
    zipapp = build_documented_zipapp(tmp_path / "checkout")
    with instance_netns(cluster, instance.address) as guest:
        done = guest.run(SYSTEM_PYTHON, "-I", "-S", str(zipapp), "ganeti", "install", "--disk", str(instance.disk),
                         "--url", f"http://{guest.host}", timeout=120)
    assert done.returncode == 0, done.stderr
    from_imds = written_environment(instance.disk)
    assert from_imds["DISK_0_PATH"] == str(instance.disk)  # the guest tool's --disk
    assert on_node["DISK_0_PATH"] == cluster.inside(instance.disk)
    assert on_node["OSP_ROOT_PASSWORD"] == from_imds["OSP_ROOT_PASSWORD"] == ROOT_PASSWORD
    same = set(from_imds) - {"DISK_0_PATH", "PWD"}  # PWD: the definition's directory, on the node or unpacked
    assert {name: from_imds[name] for name in same} == {name: on_node.get(name) for name in same}
    assert set(on_node) - set(from_imds) == NOT_IN_A_PUSH
    events = admin(imds, f"/device-events/{instance.uuid}?after=0")["events"]
    assert [event["state"] for event in events] == ["started", "script", "succeeded"]
    assert admin(imds, f"/device-os/{instance.uuid}")["mode"] == "run"  # a push's run mode: succeeded ends nothing


def test_a_modify_pushes_again_and_drops_the_secret(cluster, imds):
    """``gnt-instance modify -O`` pushes the instance again, without the secret (Ganeti sends ``{}``): imds drops it."""
    instance = add(cluster, "inst2", "-t", "diskless")
    assert instance.disk is None
    before = admin(imds, f"/device-os/{instance.uuid}")["parameters"]
    assert before["root-password"] == {"visibility": "secret", "secret_state": "held"}
    cluster.gnt("gnt-instance", "modify", "-O", "greeting=again", "inst2")
    assert admin(imds, f"/device-os/{instance.uuid}")["parameters"] == {
        "greeting": {"visibility": "public", "value": "again"},
        "root-hash": {"visibility": "private", "value": "<private>"},
    }
