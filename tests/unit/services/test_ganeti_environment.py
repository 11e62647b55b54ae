"""The OS scripts' environment: Ganeti's variables from a pushed instance, quoted so sh and shlex read them back."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

from imds.metad.convert import convert
from imds.services.ganeti.definitions import OsDefinition
from imds.services.ganeti.environment import environment, osp_name, render

NASTY = "it's a \"test\" $(touch pwned) `id` $HOME \\ back\nsecond line\ttab; rm -rf / #"
INSTANCE_ID = "0b0c8d4e-5f1a-4c2b-9d3e-7f6a5b4c3d2e"
PUSHED = {
    "name": "vm1.example.com", "uuid": INSTANCE_ID, "os": "debootstrap+buster", "hypervisor": "kvm",
    "primary_node": "node1-uuid", "ctime": 1700000000.5, "mtime": 1700000100.25, "tags": [],
    "disks": ["d1-uuid", "d2-uuid"],
    "hvparams": {"disk_type": "paravirtual", "nic_type": "e1000", "boot_order": "disk", "bad": {"x": 1}},
    "beparams": {"maxmem": 1024},
    "nics": [
        {"name": "eth0", "mac": "aa:00:00:00:00:01", "ip": "198.51.100.7", "uuid": "n1",
         "nicparams": {"mode": "bridged", "link": "br0", "vlan": ""}, "network": "net-uuid"},
        {"name": "ganeti:communication:x", "mac": "aa:00:00:00:00:02", "ip": "169.254.0.9", "uuid": "n2",
         "nicparams": {"mode": "routed", "link": "gnt.com"}},
    ],
    "osparams": {"dhcp": "yes"},
}


def definition(versions: tuple[int, ...]) -> OsDefinition:
    return OsDefinition(name="debootstrap", scripts={}, parameters={}, api_versions=versions, package=b"")


def pushed_env() -> dict[str, str]:
    converted = convert(PUSHED)
    assert converted.metadata is not None
    return environment(instance_id=INSTANCE_ID, os_type=PUSHED["os"], document=converted.metadata["metadata"],
                       definition=definition((5, 10, 20)), parameters={"root-password": NASTY, "dhcp": "yes"})


def test_a_pushed_instance_gives_ganetis_variables():
    """What metad/convert keeps of a push becomes OSEnvironment's variables, with Ganeti's names."""
    env = pushed_env()
    assert {key: env[key] for key in (
        "OS_API_VERSION", "OS_NAME", "OS_VARIANT", "INSTANCE_OS", "INSTANCE_NAME", "INSTANCE_UUID", "HYPERVISOR",
        "INSTANCE_PRIMARY_NODE", "DEBUG_LEVEL", "DISK_COUNT", "DISK_0_UUID", "DISK_1_UUID", "DISK_0_FRONTEND_TYPE",
        "NIC_COUNT", "NIC_0_MAC", "NIC_0_IP", "NIC_0_MODE", "NIC_0_LINK", "NIC_0_BRIDGE", "NIC_0_NETWORK_UUID",
        "NIC_1_MODE", "NIC_1_LINK", "NIC_0_FRONTEND_TYPE", "INSTANCE_HV_boot_order", "INSTANCE_BE_maxmem",
        "OSP_DHCP", "PATH", "INSTANCE_CTIME")} == {
        "OS_API_VERSION": "20", "OS_NAME": "debootstrap", "OS_VARIANT": "buster", "INSTANCE_OS": "debootstrap+buster",
        "INSTANCE_NAME": "vm1.example.com", "INSTANCE_UUID": INSTANCE_ID, "HYPERVISOR": "kvm",
        "INSTANCE_PRIMARY_NODE": "node1-uuid", "DEBUG_LEVEL": "0", "DISK_COUNT": "2", "DISK_0_UUID": "d1-uuid",
        "DISK_1_UUID": "d2-uuid", "DISK_0_FRONTEND_TYPE": "paravirtual", "NIC_COUNT": "2",
        "NIC_0_MAC": "aa:00:00:00:00:01", "NIC_0_IP": "198.51.100.7", "NIC_0_MODE": "bridged", "NIC_0_LINK": "br0",
        "NIC_0_BRIDGE": "br0", "NIC_0_NETWORK_UUID": "net-uuid", "NIC_1_MODE": "routed", "NIC_1_LINK": "gnt.com",
        "NIC_0_FRONTEND_TYPE": "e1000", "INSTANCE_HV_boot_order": "disk", "INSTANCE_BE_maxmem": "1024",
        "OSP_DHCP": "yes", "PATH": "/sbin:/bin:/usr/sbin:/usr/bin", "INSTANCE_CTIME": "1700000000.5",
    }
    assert env["OSP_ROOT_PASSWORD"] == NASTY
    assert "NIC_0_VLAN" not in env  # empty values are left out, as Ganeti does
    assert "INSTANCE_HV_bad" not in env  # only scalars
    assert not [key for key in env if key.startswith("DISK_") and key.endswith("_PATH")]  # a node path: never known


def test_disk_objects_give_access_size_name_and_backend():
    """A disk object (Ganeti's disks_info) gives DISK_<n>_ACCESS/_SIZE/_NAME/_BACKEND_TYPE."""
    pushed = {**PUSHED, "disks": [
        {"uuid": "d1", "name": "root", "mode": "rw", "size": 10240, "dev_type": "plain", "secret": "x"},
        {"uuid": "d2", "mode": "ro", "size": 1, "dev_type": "file", "logical_id": ["loop", "/srv/d2"]},
    ]}
    converted = convert(pushed)
    assert converted.metadata is not None
    disks = converted.metadata["metadata"]["ganeti"]["disks"]
    assert "secret" not in disks[0]  # only Ganeti's known disk keys are kept
    env = environment(instance_id=INSTANCE_ID, os_type="debootstrap", document=converted.metadata["metadata"],
                      definition=None, parameters={})
    assert {k: v for k, v in env.items() if k.startswith("DISK_")} == {
        "DISK_COUNT": "2", "DISK_0_UUID": "d1", "DISK_0_NAME": "root", "DISK_0_ACCESS": "rw", "DISK_0_SIZE": "10240",
        "DISK_0_BACKEND_TYPE": "block", "DISK_0_FRONTEND_TYPE": "paravirtual", "DISK_1_UUID": "d2",
        "DISK_1_ACCESS": "ro", "DISK_1_SIZE": "1", "DISK_1_BACKEND_TYPE": "file:loop",
        "DISK_1_FRONTEND_TYPE": "paravirtual",
    }
    assert "OS_API_VERSION" not in env  # no definition loaded: Ganeti's API version is unknown
    assert env["OS_VARIANT"] == ""


def test_an_admin_record_gives_what_it_can():
    """No ganeti object: the name from the hostname, the uuid from the id; no disks, NICs or hypervisor."""
    env = environment(instance_id=INSTANCE_ID, os_type="tiny", document={"hostname": "web-1"},
                      definition=definition((10, 15)), parameters={"root-hash": "x", "nul": "a\x00b"})
    assert env == {
        "OS_NAME": "tiny", "OS_VARIANT": "", "INSTANCE_OS": "tiny", "DEBUG_LEVEL": "0", "OS_API_VERSION": "15",
        "PATH": "/sbin:/bin:/usr/sbin:/usr/bin", "INSTANCE_UUID": INSTANCE_ID, "INSTANCE_NAME": "web-1",
        "OSP_ROOT_HASH": "x",
    }
    assert osp_name("root-password") == "OSP_ROOT_PASSWORD"


def test_the_rendered_file_round_trips_through_sh_and_shlex(tmp_path: Path):
    """``set -a; . ./env; env -0`` in sh and ``shlex.split`` give every value back (quotes, $(...), newlines)."""
    env = pushed_env()
    body = render(env)
    lines = body.decode().splitlines()
    assert lines[0].startswith("DEBUG_LEVEL=")  # sorted by name
    (tmp_path / "env").write_bytes(body)
    # No marker file may appear: nothing in a value is run.
    shown = subprocess.run(["/bin/sh", "-c", "set -a; . ./env; set +a; env -0"], cwd=tmp_path, env={},
                           capture_output=True, check=True).stdout.decode()
    read_back = dict(item.split("=", 1) for item in shown.split("\0") if item)
    assert {key: read_back.get(key) for key in env} == env
    assert not (tmp_path / "pwned").exists()
    parsed = dict(word.split("=", 1) for word in shlex.split(body.decode()))
    assert parsed == env
