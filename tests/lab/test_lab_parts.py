"""The lab's pure parts: reading the console, each flavor's kernel and SMBIOS arguments, undo order.

The real boot is tests/integration/test_lab_boot.py (slow); these pin what it relies on in
seconds: a console log cut anywhere still yields the datasource, the marker and the hostname;
a wrong datasource or hostname never passes; QEMU is told what ds-identify needs.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from imds.errors import LabError
from imds.lab.console import Console
from imds.lab.flavors import FLAVORS, flavor
from imds.lab.image import FILES, Image, recipe_key
from imds.lab.qemu import Machine, accelerators
from imds.lab.run import Cleanup, cleaned_up, spawn, write_private
from imds.lab.userdata import default_userdata

CI = "cloud-init[9]: Cloud-init v. 22.4.2"
SERIAL = f"""\
[    0.000000] Linux version 6.1.0-50-cloud-amd64 (debian-kernel@lists.debian.org)
[   25.055331] {CI} running 'init-local' at Fri, 27 Nov 2026 02:47:17 +0000. Up 24.74 seconds.
[   79.139402] {CI} running 'init' at Fri, 27 Nov 2026 02:48:11 +0000. Up 78.91 seconds.
\x1b[0;32m  OK  \x1b[0m] Reached target multi-user.target

Debian GNU/Linux 12 lab-guest ttyS0

lab-guest login: [  142.789843] {CI} running 'modules:final' at Fri. Up 142.22 seconds.
LAB-MARKER host=lab-guest\r
[  144.062789] {CI} finished at Fri, 27 Nov 2026 02:49:16 +0000. Datasource DataSourceEc2Local.  Up 143.90 seconds
"""


def _console(tmp_path: Path, text: str, hostname: str = "lab-guest") -> Console:
    log = tmp_path / "serial.log"
    log.write_bytes(text.encode())
    console = Console(log, "LAB-MARKER", hostname)
    console.poll()
    return console


def test_console_finds_datasource_marker_hostname_and_stages(tmp_path):
    """Every milestone of a passing boot is read from the log, with cloud-init's own uptimes."""
    console = _console(tmp_path, SERIAL)
    assert console.datasource == "DataSourceEc2Local"
    assert console.version == "22.4.2"
    assert console.final_uptime == pytest.approx(143.90)
    assert console.stages == {"init-local": 24.74, "init": 78.91, "modules:final": 142.22}
    assert console.login_host == "lab-guest"
    assert console.marker_line == "LAB-MARKER host=lab-guest"
    assert {"kernel", "login", "hostname", "marker", "cloud-init final"} <= set(console.seen)
    assert console.done("DataSourceEc2")
    assert not console.done("DataSourceOpenStack")


def test_console_read_in_pieces_gives_the_same_answer(tmp_path):
    """A log read while QEMU writes it, cut mid-line, yields the same milestones."""
    log = tmp_path / "serial.log"
    console = Console(log, "LAB-MARKER", "lab-guest")
    console.poll()  # no file yet
    data = SERIAL.encode()
    with log.open("wb") as sink:
        for start in range(0, len(data), 37):
            sink.write(data[start:start + 37])
            sink.flush()
            console.poll()
    assert console.done("DataSourceEc2")
    assert console.datasource == "DataSourceEc2Local"


def test_wrong_hostname_or_missing_marker_never_passes(tmp_path):
    """The hostname must be the record's; the marker must have been printed, not just echoed."""
    assert not _console(tmp_path, SERIAL, hostname="other-host").done("DataSourceEc2")
    echoed = SERIAL.replace("LAB-MARKER host=lab-guest", "+ echo LAB-MARKER host=lab-guest")
    assert not _console(tmp_path, echoed.replace("lab-guest login:", "lab-image login:")).done("DataSourceEc2")


def test_default_userdata_prints_marker_and_hostname():
    """The default cloud-config runs one command printing the marker and the hostname to the console."""
    text = default_userdata("MARK").decode()
    assert text.startswith("#cloud-config\nruncmd:\n")
    assert "echo MARK host=$(hostname) > /dev/ttyS0" in text


def test_flavor_arguments():
    """ci.ds on the command line, SMBIOS per cloud, the EC2 uuid/serial pair and NoCloud's seed."""
    ec2 = flavor("ec2")
    uuid = "ec2c1a5e-8f2b-4a57-9a65-1d2a3b4c5d6e"
    assert ec2.kernel_args("cmdline") == ["ci.ds=Ec2"]
    assert ec2.kernel_args("smbios") == []
    smbios = ec2.smbios_arg("cmdline", uuid)  # AWS identity is needed for IMDSv2 either way
    assert smbios == f"type=1,manufacturer=Amazon EC2,product=t3.micro,serial={uuid},uuid={uuid}"
    nocloud = flavor("nocloud")
    assert nocloud.kernel_args("cmdline") == ["ci.ds=NoCloud", "ds=nocloud-net;s=http://169.254.169.254/nocloud/"]
    assert nocloud.smbios_arg("smbios", "u") == "type=1,serial=ds=nocloud-net;s=http://169.254.169.254/nocloud/,uuid=u"
    assert flavor("configdrive").smbios_arg("cmdline", "u") == "type=1,uuid=u"
    assert flavor("openstack").smbios_arg("cmdline", "u") == (
        "type=1,manufacturer=OpenStack Foundation,product=OpenStack Nova,uuid=u")
    assert {f.datasource for f in FLAVORS.values()} == {
        "DataSourceEc2", "DataSourceOpenStack", "DataSourceNoCloud", "DataSourceConfigDrive"}
    with pytest.raises(LabError, match="unknown flavor 'gce'"):
        flavor("gce")


def test_qemu_command(tmp_path):
    """Kernel boot with the console on ttyS0, the tap without vnet_hdr, a qcow2 overlay; -cpu host only on KVM."""
    image = Image(tmp_path / "rootfs.ext4", tmp_path / "vmlinuz", tmp_path / "initrd.img")
    machine = Machine(image, tmp_path, "lvm0001", "52:54:00:00:00:01", ("ci.ds=Ec2",), "type=1,uuid=u")
    tcg = machine.command("tcg")
    assert tcg[tcg.index("-append") + 1] == "root=/dev/vda rw console=ttyS0 panic=1 ci.ds=Ec2"
    assert "tap,id=net0,ifname=lvm0001,script=no,downscript=no,vnet_hdr=off" in tcg
    assert f"file:{tmp_path / 'serial.log'}" in tcg
    assert f"file={tmp_path / 'disk.qcow2'},if=virtio,format=qcow2" in tcg
    assert "-cpu" not in tcg
    kvm = machine.command("kvm")
    assert kvm[kvm.index("-cpu") + 1] == "host"
    assert accelerators("tcg") == ["tcg"]
    assert accelerators("auto")[-1] == "tcg"


def test_recipe_key_follows_the_recipe(monkeypatch):
    """The cache key changes with any file written into the image (and only with the recipe)."""
    before = recipe_key()
    assert before == recipe_key()
    monkeypatch.setitem(FILES, "etc/hostname", "other\n")
    assert recipe_key() != before


def test_cleanup_runs_newest_first_and_survives_failures():
    """Every undo runs, newest first; a failing one is reported, not raised."""
    done: list[str] = []
    cleanup = Cleanup()
    cleanup.add("first", lambda: done.append("first"))
    cleanup.add("broken", lambda: 1 / 0)
    cleanup.add("last", lambda: done.append("last"))
    cleanup.close()
    assert done == ["last", "first"]
    assert len(cleanup.failures) == 1
    assert cleanup.failures[0].startswith("broken: ")


def test_children_are_stopped_by_pid_on_error_and_on_sigterm(tmp_path):
    """A child registered with the cleanup is gone after an exception and after SIGTERM to the lab."""
    children = []

    def fail_with_a_child() -> None:
        with cleaned_up() as cleanup:
            sleeper = spawn([sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "child.log")
            children.append(cleanup.process("sleeper", sleeper))
            raise RuntimeError

    with pytest.raises(RuntimeError):
        fail_with_a_child()
    assert children[0].poll() is not None
    script = (
        "import os, signal, sys, time\n"
        "from pathlib import Path\n"
        "from imds.lab.run import cleaned_up, spawn\n"
        "with cleaned_up() as c:\n"
        "    sleeper = [sys.executable, '-c', 'import time; time.sleep(60)']\n"
        f"    p = c.process('s', spawn(sleeper, Path({str(tmp_path)!r}) / 'c.log'))\n"
        "    print(p.pid, flush=True)\n"
        "    time.sleep(60)\n"
    )
    with subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True) as lab:
        assert lab.stdout is not None
        pid = int(lab.stdout.readline())
        lab.send_signal(signal.SIGTERM)
        assert lab.wait(timeout=30) == 128 + signal.SIGTERM
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]


def test_secrets_are_written_owner_only(tmp_path):
    """Keys and tokens are 0600 from creation, and a second write replaces the first."""
    target = tmp_path / "admin-token"
    write_private(target, b"one")
    write_private(target, b"two")
    assert target.read_bytes() == b"two"
    assert target.stat().st_mode & 0o777 == 0o600
