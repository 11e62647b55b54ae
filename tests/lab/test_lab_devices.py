"""--device-tags and --hotplug without a VM: the record's tags, the console's device lines, QMP, QEMU's arguments."""

from __future__ import annotations

import email
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from imds.errors import LabError
from imds.lab import boot as lab_boot
from imds.lab import datapath, devices, hotplug
from imds.lab.boot import Options, refusal
from imds.lab.console import Console
from imds.lab.image import Image
from imds.lab.qemu import Machine
from imds.lab.qmp import Qmp
from imds.lab.userdata import lab_userdata
from imds.models import Instance
from imds.services.records.devices import check_devices
from imds.services.render.network import derived_network_data
from imds.services.render.openstack import meta_data_document

MAC = "52:54:00:12:34:56"


def document() -> dict[str, Any]:
    guest = lab_boot.Guest("u-1", MAC, "ssh-ed25519 AAAA imds-lab")
    doc = lab_boot._metadata(guest, "lab-guest", datapath.Route("gateway"), dhcp=False)
    doc["devices"] = devices.boot_devices(MAC)
    return doc


def test_the_boot_tags_are_valid_nova_devices_served_in_meta_data():
    """The NIC by MAC and the disk by serial pass the schema and reach meta_data.json as given."""
    doc = document()
    assert check_devices(doc["devices"]) == []
    served = meta_data_document(Instance(id="u-1", metadata=doc), "latest")["devices"]
    assert served == [{"type": "nic", "bus": "pci", "mac": MAC, "tags": ["primary"]},
                      {"type": "disk", "bus": "pci", "serial": "imds-lab-data", "tags": ["labdata"]}]


def test_the_hot_record_adds_the_port_its_address_and_two_tags():
    """with_hot_devices: interface ens8, its address on it (not on eth0), a tagged NIC and disk at slots 8 and 9."""
    mac = hotplug.hot_mac(MAC)
    assert mac == "52:54:00:12:34:a9"
    doc = document()
    hot = hotplug.with_hot_devices(doc, mac)
    assert doc["devices"] == devices.boot_devices(MAC)  # the boot record is left as it was
    assert check_devices(hot["devices"]) == []
    assert hot["devices"][-2:] == [
        {"type": "nic", "bus": "pci", "address": "0000:00:08.0", "mac": mac, "tags": ["hotnic"]},
        {"type": "disk", "bus": "pci", "address": "0000:00:09.0", "serial": "imds-lab-hot", "tags": ["hotdisk"]}]
    data = derived_network_data(hot)
    links = [(link["name"], link["ethernet_mac_address"]) for link in data["links"]]
    assert links == [("eth0", MAC), ("ens8", mac)]
    placed = [(n["link"], n["ip_address"]) for n in data["networks"]]
    assert placed == [("eth0", "10.231.0.10"), ("ens8", "10.231.1.10")]
    assert data["networks"][1]["routes"] == []  # the way to metadata stays on eth0


def test_the_console_follows_the_watchers_device_lines():
    """A device line is kept until its ``gone`` line; the boot's expected tags make it pass."""
    console = Console(Path("/nonexistent"), "LAB-MARKER", "h", expect_devices=devices.expected(MAC))
    console._line(f"LAB-DEVICES nic {MAC} eth0 tag= addr=10.231.0.10/24", 1.0)
    assert not console.devices_shown()
    console._line(f"LAB-DEVICES gone nic {MAC} eth0 tag= addr=10.231.0.10/24", 2.0)
    console._line(f"[  99.1] LAB-DEVICES nic {MAC} eth0 tag=primary addr=10.231.0.10/24", 3.0)
    console._line("LAB-DEVICES disk labdata vdc", 3.0)
    assert sorted(console.devices) == ["disk labdata vdc", f"nic {MAC} eth0 tag=primary addr=10.231.0.10/24"]
    assert console.devices_shown()
    console._line("LAB-DEVICES gone disk labdata vdc", 4.0)
    assert not console.devices_shown()


def test_the_watcher_reads_from_the_metadata_service_or_the_config_drive():
    """imds-guest udev's source follows the flavor; the part carries the zipapp and starts the watcher."""
    assert devices.source(config_drive=True, metadata_url="http://169.254.169.254") == "--config-drive auto"
    assert devices.source(config_drive=False, metadata_url="http://[fd00:ec2::254]") == (
        "--metadata-url http://[fd00:ec2::254]")
    part = devices.devices_script(b"PK\x03\x04zipapp", "--config-drive auto")
    assert "python3 /root/imds-guest.pyz udev --config-drive auto" in part
    assert "systemd-run --no-block --unit=imds-lab-devices sh /root/imds-lab-devices.sh" in part
    assert "UEsDBHppcGFwcA==" in part  # the zipapp, base64


def test_hotplug_userdata_enables_cloud_inits_hotplug_beside_the_marker():
    """The lab's cloud-config part (updates: network: when: [boot, hotplug]) rides as its own part."""
    message = email.message_from_bytes(lab_userdata(None, "LAB-MARKER", [], [hotplug.USERDATA]))
    parts = [(part.get_content_type(), part.get_payload(decode=True)) for part in message.walk()
             if not part.is_multipart()]
    assert [kind for kind, _ in parts] == ["text/cloud-config", "text/cloud-config"]
    assert b"LAB-MARKER" in parts[0][1]  # the default cloud-config is still the first part
    assert yaml.safe_load(parts[1][1]) == {"updates": {"network": {"when": ["boot", "hotplug"]}}}


def test_qemu_gets_the_tagged_disk_with_its_serial_and_a_qmp_socket(tmp_path):
    """The disk as -drive if=none plus -device virtio-blk-pci,serial=... (QEMU 7.2's -drive takes no serial); -qmp."""
    image = Image(tmp_path / "disk.raw", tmp_path / "vmlinuz", tmp_path / "initrd.img")
    machine = Machine(image, tmp_path, "lvm0001", MAC, tagged_disk=(tmp_path / "t.raw", "imds-lab-data"),
                      qmp=tmp_path / "q.sock")
    command = machine.command("tcg")
    assert f"file={tmp_path / 't.raw'},if=none,id=tagged,format=raw" in command
    assert "virtio-blk-pci,drive=tagged,serial=imds-lab-data,addr=0x7" in command  # after the root disk
    assert command[command.index("-qmp") + 1] == f"unix:{tmp_path / 'q.sock'},server=on,wait=off"
    assert "-qmp" not in Machine(image, tmp_path, "lvm0001", MAC).command("tcg")


@pytest.mark.parametrize(("flavor", "extra", "refused"), [
    ("openstack", {"device_tags": True}, False), ("configdrive", {"device_tags": True}, False),
    ("ec2", {"device_tags": True}, True), ("openstack", {"hotplug": True}, False),
    ("configdrive", {"hotplug": True}, True), ("openstack", {"hotplug": True, "ipv6_only": True, "suite": "trixie"},
                                                True),
    ("openstack", {"ipv6_only": True}, True), ("openstack", {"ipv6_only": True, "suite": "trixie"}, False),
])
def test_what_the_lab_refuses(tmp_path, flavor, extra, refused):
    """Tags only where Nova has them; hotplug over IPv4 on OpenStack; OpenStack IPv6-only only past bookworm."""
    options = Options(flavor, tmp_path, "h", Image(tmp_path / "x"), **extra)
    assert (refusal(options) is not None) is refused


class FakeQemu:
    """A QMP server on a Unix socket: a greeting, then one answer per command (an event before device_del's)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seen: list[dict[str, Any]] = []
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen(1)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.server.accept()
        with conn, conn.makefile("rwb") as stream:
            stream.write(b'{"QMP": {"version": {}, "capabilities": []}}\n')
            stream.flush()
            for line in stream:
                message = json.loads(line)
                self.seen.append(message)
                if message["execute"] == "device_add" and message["arguments"].get("id") == "bad":
                    stream.write(b'{"error": {"class": "GenericError", "desc": "Duplicate ID"}}\n')
                elif message["execute"] == "device_del":
                    stream.write(b'{"return": {}}\n{"event": "DEVICE_DELETED", "data": {"device": "hotnic"}}\n')
                else:
                    stream.write(b'{"event": "NIC_RX_FILTER_CHANGED", "data": {}}\n{"return": {}}\n')
                stream.flush()


@pytest.fixture
def fake_qemu(tmp_path) -> Iterator[FakeQemu]:
    fake = FakeQemu(tmp_path / "q.sock")
    yield fake
    fake.server.close()


def test_qmp_negotiates_runs_commands_and_waits_for_events(fake_qemu):
    """qmp_capabilities first; returns through interleaved events; errors as LabError; DEVICE_DELETED awaited."""
    with Qmp(fake_qemu.path) as qmp:
        assert qmp.execute("netdev_add", type="tap", id="hotnet", ifname="t", vnet_hdr=False) == {}
        with pytest.raises(LabError, match="Duplicate ID"):
            qmp.execute("device_add", driver="virtio-net-pci", id="bad")
        qmp.execute("device_del", id="hotnic")
        assert qmp.wait_event("DEVICE_DELETED", 10.0, device="hotnic")["data"] == {"device": "hotnic"}
        with pytest.raises(LabError, match="no DEVICE_DELETED"):
            qmp.wait_event("DEVICE_DELETED", 0.5, device="hotdisk")
    assert [m["execute"] for m in fake_qemu.seen] == ["qmp_capabilities", "netdev_add", "device_add", "device_del"]
    assert fake_qemu.seen[1]["arguments"] == {"type": "tap", "id": "hotnet", "ifname": "t", "vnet_hdr": False}


def test_qmp_without_qemu_is_a_lab_error(tmp_path):
    """Nothing listening: LabError naming the socket."""
    with pytest.raises(LabError, match="QMP"):
        Qmp(tmp_path / "none.sock")


def test_the_guests_own_logs_are_kept_apart_from_the_device_lines():
    """LAB-GUESTLOG lines (the hotplug hook's journal) go to guest_log, never into the device state."""
    console = Console(Path("/nonexistent"), "LAB-MARKER", "h")
    console._line("LAB-GUESTLOG Nov 28 cloud-init-hotplugd[512]: args=--subsystem=net handle", 1.0)
    console._line("LAB-DEVICES disk hotdisk vdc", 1.0)
    assert console.guest_log == ["Nov 28 cloud-init-hotplugd[512]: args=--subsystem=net handle"]
    assert list(console.devices) == ["disk hotdisk vdc"]
