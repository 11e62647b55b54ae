"""``imds lab boot --ganeti-install``, everything but the VM: the userdata, QEMU's second disk, the verdict.

The real boot is tests/integration/test_lab_boot.py (slow). These pin the pieces it relies on,
in seconds: cloud-init's own parser finds the install script between the operator's userdata
and the marker script; the zipapp in it is the one docs/guest.md builds; QEMU gets the second
disk as /dev/vdb; the console's ``LAB-GANETI exit=N`` holds the watch until the install ended;
refused combinations exit 2 before anything runs; and the verdict fails on each missing piece.
One test runs the guest script itself, unchanged but for its paths, against a real ``imds
serve`` started with the lab's arguments: the image lands on the "disk" (a file), the events
and the mode come back, and the verdict passes.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import zipfile
from io import BytesIO
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from cloudinit_guard import run_cloud_init
from guest_zipapp import build_documented_zipapp
from imds.cli import cli
from imds.lab import boot as lab_boot
from imds.lab import datapath, ganeti
from imds.lab import image as lab_image
from imds.lab.boot import Options, refusal
from imds.lab.console import Console
from imds.lab.ganeti import CONSOLE, GUEST_DISK, GUEST_TOOL, SCRIPT, Install, Installing, guest_script, guest_zipapp
from imds.lab.image import Image
from imds.lab.qemu import Machine
from imds.lab.server import Server as LabServer
from imds.lab.userdata import MARKER_SCRIPT, default_userdata, lab_userdata, marker_script
from imds.services.ganeti.wire import parse_os_write
from imds.services.render.network import network_data
from serve_process import ADMIN_TOKEN, serving

ID = "ec2c1a5e-8f2b-4a57-9a65-1d2a3b4c5d6e"
PARSE = r"""
import base64, json, sys
cfg = json.loads(sys.argv[1])
from cloudinit import helpers, user_data
paths = helpers.Paths({"cloud_dir": cfg["tmp"] + "/cloud", "run_dir": cfg["tmp"] + "/run"})
msg = user_data.UserDataProcessor(paths).process(base64.b64decode(cfg["blob"]))
print(json.dumps([{"type": p.get_content_type(), "filename": p.get_filename(),
                   "payload": base64.b64encode(p.get_payload(decode=True)).decode()}
                  for p in msg.walk() if p.get_content_maintype() != "multipart"]))
"""


def parsed(tmp_path: Path, blob: bytes) -> list[dict[str, Any]]:
    """Each leaf part cloud-init's UserDataProcessor makes of ``blob``: type, file name, bytes."""
    got = run_cloud_init(PARSE, {"tmp": str(tmp_path), "blob": base64.b64encode(blob).decode()}, tmp_path, 60)
    parts: list[dict[str, Any]] = json.loads(json.dumps(got))
    for part in parts:
        part["payload"] = base64.b64decode(part["payload"])
    return parts


def members(archive: bytes) -> dict[str, bytes]:
    """A zipapp's files (the shebang line before the zip is skipped by zipfile)."""
    with zipfile.ZipFile(BytesIO(archive)) as opened:
        return {name: opened.read(name) for name in opened.namelist() if not name.endswith("/")}


def test_the_zipapp_is_the_one_docs_guest_md_builds(tmp_path):
    """Same files, same bytes, as the documented recipe; it starts with the system python's shebang."""
    ours = guest_zipapp()
    assert ours.startswith(b"#!/usr/bin/python3\n")
    documented = build_documented_zipapp(tmp_path / "checkout").read_bytes()
    assert members(ours) == members(documented)
    assert "imds/guest/ganeti.py" in members(ours)


def test_cloud_init_finds_the_install_script_before_the_marker(tmp_path):
    """Default userdata: the cloud-config, then the install script. Operator's: theirs, the install, the marker."""
    script = guest_script(b"zipapp bytes", "http://169.254.169.254")
    default = parsed(tmp_path / "default", lab_userdata(None, "MARK", [(SCRIPT, script)]))
    assert [(p["type"], p["payload"]) for p in default] == [
        ("text/cloud-config", default_userdata("MARK")), ("text/x-shellscript", script.encode())]
    assert default[1]["filename"] == SCRIPT
    operator = b"#!/bin/sh\necho OPERATOR > /dev/ttyS0\n"
    mine = parsed(tmp_path / "operator", lab_userdata(operator, "MARK", [(SCRIPT, script)]))
    assert [p["payload"] for p in mine] == [operator, script.encode(), marker_script("MARK").encode()]
    assert [p["filename"] for p in mine[1:]] == [SCRIPT, MARKER_SCRIPT]
    # cloud-init's scripts-user runs them sorted by name: the operator's, runcmd, the install, the marker.
    names = [mine[0]["filename"], "runcmd", SCRIPT, MARKER_SCRIPT]
    assert sorted(names) == names
    assert lab_userdata(None, "MARK") == default_userdata("MARK")  # without --ganeti-install: as before


def test_the_script_writes_the_zipapp_and_installs_onto_vdb():
    """The zipapp in base64 (decoded back whole), the install command, the exit status to the console."""
    tool = guest_zipapp()
    text = guest_script(tool, "http://[fd00:ec2::254]")
    encoded = text.split("<<'IMDS_GUEST_PYZ'\n", 1)[1].split("IMDS_GUEST_PYZ\n", 1)[0]
    assert base64.b64decode(encoded) == tool
    assert f"python3 {GUEST_TOOL} ganeti install --disk {GUEST_DISK} --url http://[fd00:ec2::254] " in text
    assert GUEST_DISK == "/dev/vdb"
    assert text.endswith(f'echo "{CONSOLE} exit=$?" > /dev/ttyS0\n')


def test_qemu_gets_the_second_disk_right_after_the_root_one(tmp_path):
    """A raw virtio drive after the overlay (so /dev/vdb), before a config drive; none without one."""
    image = Image(tmp_path / "rootfs.ext4", tmp_path / "vmlinuz", tmp_path / "initrd.img")
    disk = tmp_path / "disk2.raw"
    args = Machine(image, tmp_path, "lvm0001", "52:54:00:00:00:01", second_disk=disk,
                   cdrom=tmp_path / "cd.iso").command("tcg")
    drives = [args[i + 1] for i, arg in enumerate(args) if arg == "-drive"]
    assert drives == [f"file={tmp_path / 'disk.qcow2'},if=virtio,format=qcow2",
                      f"file={disk},if=virtio,format=raw",
                      f"file={tmp_path / 'cd.iso'},if=virtio,format=raw,readonly=on"]
    plain = Machine(image, tmp_path, "lvm0001", "52:54:00:00:00:01").command("tcg")
    assert [a for a in plain if a.startswith("file=")] == [f"file={tmp_path / 'disk.qcow2'},if=virtio,format=qcow2"]


def test_the_console_holds_the_watch_until_the_install_line(tmp_path):
    """done() waits for ``LAB-GANETI exit=N`` (its status kept); an echoed line is no install; off: unchanged."""
    log = tmp_path / "serial.log"
    boot = ("LAB-MARKER host=lab-guest\r\n[  144.06] cloud-init[9]: Cloud-init v. 22.4.2 finished at Fri. "
            "Datasource DataSourceEc2Local.  Up 143.90 seconds\n")
    log.write_text(boot + "+ echo LAB-GANETI exit=0\n")
    console = Console(log, "LAB-MARKER", "lab-guest", install=CONSOLE)
    console.poll()
    assert not console.done("DataSourceEc2")
    assert console.install_exit is None
    with log.open("a") as sink:
        sink.write("imds-guest: image: 4194304 bytes written to /dev/vdb, synced\nLAB-GANETI exit=1\r\n")
    console.poll()
    assert console.done("DataSourceEc2")
    assert console.install_exit == 1
    assert "ganeti install" in console.seen
    plain = Console(log, "LAB-MARKER", "lab-guest")
    plain.poll()
    assert plain.done("DataSourceEc2")
    assert plain.install_exit is None


def _options(tmp_path: Path, name: str, **extra: Any) -> Options:
    return Options(name, tmp_path / "run", "lab-guest", Image(tmp_path / "disk"), **extra)


def test_configdrive_and_url_are_refused(tmp_path):
    """No metadata network (config drive), or another server (it cannot serve the run's image): refused."""
    assert refusal(_options(tmp_path, "configdrive", ganeti_install=True)) == (
        "--ganeti-install: a config drive guest has no metadata network to install through")
    reason = refusal(_options(tmp_path, "ec2", ganeti_install=True, url="http://127.0.0.1:1"))
    assert reason is not None
    assert "drop --url" in reason
    assert [name for name in ("ec2", "openstack", "nocloud") if refusal(_options(tmp_path, name,
                                                                              ganeti_install=True))] == []
    assert refusal(_options(tmp_path, "configdrive")) is None


def test_cli_refuses_configdrive_at_once(tmp_path, monkeypatch):
    """``--ganeti-install --flavor configdrive``: exit 2 with the reason, nothing built or booted."""
    monkeypatch.setattr(lab_image, "build", lambda *_a: pytest.fail("refused runs build nothing"))
    monkeypatch.setattr(lab_boot, "boot", lambda *_a: pytest.fail("refused runs boot nothing"))
    result = CliRunner().invoke(cli, ["lab", "boot", "--flavor", "configdrive", "--ganeti-install",
                                      "--out", str(tmp_path / "run")], prog_name="imds")
    assert result.exit_code == 2
    assert "no metadata network" in result.output
    assert not (tmp_path / "run").exists()


def test_image_disk_and_marker_without_mounting(tmp_path):
    """mke2fs -d makes the image, the empty disk is sparse and holds no marker, the image copied onto it does."""
    install = Install(tmp_path)
    image = install.build_image(ID)
    assert image.parent == (tmp_path / "ganeti-images").resolve()
    assert install.serve_args() == ["--ganeti-os-image-dir", str(image.parent)]
    disk = ganeti.fresh_disk(install.disk)
    assert disk.stat().st_size == ganeti.DISK_BYTES
    assert disk.stat().st_blocks == 0  # sparse
    assert install.disk_marker() is None
    with disk.open("r+b") as sink:
        sink.write(image.read_bytes())
    assert install.disk_marker() == f"{ID}\n"
    ganeti.fresh_disk(install.disk)
    assert install.disk_marker() is None  # a fresh disk forgets the earlier run's
    assert Install(tmp_path / "none").disk_marker() is None


def test_the_os_record_is_what_the_admin_api_accepts(tmp_path):
    """Install mode, communication off, one public os-image: the node path."""
    write = parse_os_write(ganeti.os_record(ID, tmp_path / "img"), max_value_bytes=4096)
    assert (write.mode, write.communication, write.os_type) == ("install", False, "imds-lab")
    assert ganeti.os_record(ID, tmp_path / "img")["parameters"] == {
        "os-image": {"value": str(tmp_path / "img"), "visibility": "public"}}


EVENTS = [{"state": "started"}, {"state": "image", "message": "50%"}, {"state": "image"},
          {"state": "succeeded"}, {"state": "mode", "message": "run"}]


def test_verdict_passes_only_with_every_piece():
    """Exit 0, the events in order with the mode event, mode run, the marker: passed; each one missing: not."""
    good = ganeti.verdict(0, EVENTS, "run", f"{ID}\n", ID)
    assert good == {"passed": True, "exit": 0, "events": ["started", "image", "image", "succeeded", "mode"],
                    "mode": "run", "disk_marker": f"{ID}\n", "problems": []}
    failing = {
        "exit 1": ganeti.verdict(1, EVENTS, "run", f"{ID}\n", ID),
        "no console line": ganeti.verdict(None, EVENTS, "run", f"{ID}\n", ID),
        "no image event": ganeti.verdict(0, [e for e in EVENTS if e["state"] != "image"], "run", f"{ID}\n", ID),
        "succeeded before image": ganeti.verdict(0, [EVENTS[0], EVENTS[3], EVENTS[1], EVENTS[4]], "run", f"{ID}\n", ID),
        "no mode event": ganeti.verdict(0, EVENTS[:-1], "run", f"{ID}\n", ID),
        "mode event not run": ganeti.verdict(0, [*EVENTS[:-1], {"state": "mode", "message": "install"}], "run",
                                      f"{ID}\n", ID),
        "still installing": ganeti.verdict(0, EVENTS, "install", f"{ID}\n", ID),
        "disk empty": ganeti.verdict(0, EVENTS, "run", None, ID),
        "another run's disk": ganeti.verdict(0, EVENTS, "run", "another-id\n", ID),
    }
    assert {name for name, found in failing.items() if found["passed"] or not found["problems"]} == set()
    assert failing["exit 1"]["problems"] == ["imds-guest ganeti install exited 1"]
    assert failing["still installing"]["problems"] == ["the OS record is in mode install, not run"]


def test_the_guest_script_installs_through_a_real_serve(tmp_path):
    """The userdata's script, run as the guest would (paths aside), against ``imds serve`` with the lab's arguments.

    The record's address is 127.0.0.1, where the script's requests come from; the "disk" is a
    sparse file. The console line says exit 0, the image (the marker) is on the disk, the events
    and the mode come back, and the verdict passes; prepared again, a second power-on starts over.
    """
    install = Install(tmp_path / "run")
    install.build_image(ID)
    args = ("--db", f"sqlite:///{tmp_path / 'imds.db'}", *install.serve_args())
    with serving(tmp_path, *args) as served:
        server = LabServer(served.url, ADMIN_TOKEN)
        server.push(ID, ["127.0.0.1"], {"id": ID, "hostname": "lab-guest"}, default_userdata())
        installing = Installing(install, server, ID)
        for _power_on in range(2):
            installing.prepare()
            assert install.disk_marker() is None
            console = tmp_path / "console"
            console.write_text("")
            script = tmp_path / SCRIPT
            script.write_text(guest_script(guest_zipapp(), served.url).replace(GUEST_TOOL, str(tmp_path / "tool.pyz"))
                              .replace("/dev/ttyS0", str(console)).replace(GUEST_DISK, str(install.disk)))
            done = subprocess.run(["/bin/sh", str(script)], capture_output=True, text=True, timeout=120, check=False,
                                  env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
            assert done.returncode == 0, done.stderr
            text = console.read_text()
            assert re.search(rf"^{CONSOLE} exit=0$", text, re.MULTILINE), text
            found = verdict_of(installing, console)
            assert found["passed"] is True, found
            assert found["events"][0] == "started"  # this power-on's events only
            assert found["disk_marker"] == f"{ID}\n"


def verdict_of(installing: Installing, console: Path) -> dict[str, Any]:
    """What the lab records: the console read by ``Console``, then ``Installing.verdict``."""
    reader = Console(console, "LAB-MARKER", "lab-guest", install=CONSOLE)
    reader.poll()
    return installing.verdict(reader.install_exit)


def test_an_installing_guest_keeps_its_route_to_metadata_in_the_derived_network():
    """The record carries no network_data of its own (the lab's old workaround): imds derives the route.

    Static without a route to 169.254.169.254 dropped the DHCP lease's once cloud-init applied
    it, and an OpenStack guest's install found the network unreachable (seen in a real boot).
    """
    guest = lab_boot.Guest("u-1", "52:54:00:00:00:01", "ssh-ed25519 AAAA imds-lab")
    document = lab_boot._metadata(guest, "lab-guest", datapath.Route("dhcp"), dhcp=False)
    assert "network_data" not in document
    (network,) = network_data(document)["networks"]
    assert network["type"] == "ipv4"
    assert network["routes"] == [{"network": "169.254.169.254", "netmask": "255.255.255.255",
                                  "gateway": datapath.DHCP_SERVER}]
