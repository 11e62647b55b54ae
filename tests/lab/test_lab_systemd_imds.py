"""``imds lab boot --systemd-imds``, everything but the VM: SMBIOS, the record, the probe script, the verdict.

The real boot is tests/integration/test_lab_boot.py (slow). These pin, in seconds, what it relies
on: QEMU gets the BIOS vendor systemd's hwdb matches for EC2 beside the system fields; the record
has the public addresses systemd's keys read; cloud-init's own parser finds the probe script
before the marker; the probe script, run by ``sh`` against stand-ins for ``systemd-imds`` and
``systemctl``, prints what the verdict reads; the verdict fails on each missing piece; and the
combinations the lab cannot judge are refused before anything runs.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from imds.lab import boot as lab_boot
from imds.lab import datapath
from imds.lab.boot import Options, refusal
from imds.lab.image import Image, Recipe
from imds.lab.qemu import Machine
from imds.lab.systemd_imds import (
    BIOS_VENDOR,
    CONSOLE,
    KEYS,
    SCRIPT,
    TOOL,
    guest_script,
    public_addresses,
    read_console,
    verdict,
)
from imds.lab.userdata import MARKER_SCRIPT, lab_userdata

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHl8 imds-lab"
USERDATA = lab_userdata(None, "LAB-MARKER", [(SCRIPT, guest_script())])
EXPECTED = {"hostname": "lab-guest", "region": "lab", "zone": "lab1", "ipv4-public": "198.51.100.7",
            "ipv6-public": "2001:db8:ec2::7", "ssh-key": KEY, "userdata": ""}
VALUES = {**EXPECTED, "userdata": USERDATA.decode()}
SERVED = [{"t": 1.0, "path": "/latest/api/token", "status": 200},
          *({"t": 2.0, "path": f"/latest{path}", "status": 200} for path in KEYS.values())]


def test_qemu_gets_the_bios_vendor_systemd_matches_for_ec2(tmp_path):
    """``-smbios type=0,vendor=Amazon EC2`` beside the type 1 fields (hwdb: dmi:bvnAmazonEC2:*)."""
    image = Image(tmp_path / "rootfs.ext4", tmp_path / "vmlinuz", tmp_path / "initrd.img")
    args = Machine(image, tmp_path, "lvm0001", "52:54:00:00:00:01", smbios="type=1,manufacturer=Amazon EC2",
                   smbios_extra=(BIOS_VENDOR,)).command("tcg")
    assert [args[i + 1] for i, arg in enumerate(args) if arg == "-smbios"] == [
        "type=1,manufacturer=Amazon EC2", "type=0,vendor=Amazon EC2"]


def test_the_record_has_every_key_systemd_reads():
    """Public IPv4 and IPv6 beside the private address; the EC2 flavor renders them as systemd's keys read them."""
    from imds.services.render.ec2 import aws_meta_data  # noqa: PLC0415 - the renderer the guest's reads meet

    guest = lab_boot.Guest("ec2c1a5e-8f2b-4a57-9a65-1d2a3b4c5d6e", "52:54:00:00:00:01", KEY)
    document = lab_boot._metadata(guest, "lab-guest", datapath.Route("onlink"), dhcp=False)
    document["network"]["addresses"] += public_addresses()  # as the boot adds them with --systemd-imds
    tree = aws_meta_data(document, guest.uuid)
    seen = {"hostname": tree["hostname"], "region": tree["placement"]["region"],  # type: ignore[index]
            "zone": tree["placement"]["availability-zone"], "ipv4-public": tree["public-ipv4"],  # type: ignore[index]
            "ipv6-public": tree["ipv6"], "ssh-key": tree["public-keys"]["0"]["openssh-key"]}  # type: ignore[index]
    assert seen == {k: v for k, v in EXPECTED.items() if k != "userdata"}
    assert lab_boot._metadata(guest, "h", datapath.Route("onlink"), dhcp=False)["network"]["addresses"][0][
        "public"] is False


def _stand_ins(bin_dir: Path, values: dict[str, str], *, failing: str | None = None) -> None:
    """``systemd-imds`` answering each well-known key from ``values`` (``failing`` exits 1) and ``systemctl``."""
    bin_dir.mkdir()
    answers = bin_dir / "answers"
    answers.mkdir()
    for key, value in values.items():
        if key != failing:
            (answers / key).write_text(value)
    (bin_dir / "systemd-imds").write_text(
        f'#!/bin/sh\n[ $# -eq 0 ] && {{ echo "Vendor: amazon-ec2"; exit 0; }}\nkey="${{2#--well-known=}}"\n'
        f'[ -f "{answers}/$key" ] || {{ echo "Key not available." >&2; exit 1; }}\ncat "{answers}/$key"\n')
    (bin_dir / "systemctl").write_text('#!/bin/sh\n[ "$3" = Result ] && echo success || echo inactive\n')
    (bin_dir / "journalctl").write_text('#!/bin/sh\necho "[ 12.3] systemd[1]: Starting systemd-imds-import.service"\n'
                                        'echo "[ 12.4] systemd[1]: Started something else"\n')
    for tool in ("systemd-imds", "systemctl", "journalctl"):
        (bin_dir / tool).chmod(0o755)


def _run_probe(tmp_path: Path, values: dict[str, str], **kwargs: Any) -> list[str]:
    """The probe script as the guest runs it, its console and credentials in ``tmp_path``."""
    _stand_ins(tmp_path / "bin", values, **kwargs)
    credstore = tmp_path / "credstore"
    credstore.mkdir()
    (credstore / "firstboot.hostname").write_text(values["hostname"])
    (credstore / "ssh.authorized_keys.root").write_text(values["ssh-key"] + "\n")
    console = tmp_path / "console"
    script = guest_script().replace("/dev/ttyS0", str(console)).replace("/run/credstore", str(credstore))
    script = script.replace(TOOL, str(tmp_path / "bin" / "systemd-imds"))
    script = script.replace("/tmp/imds-lab-", str(tmp_path / "imds-lab-"))  # noqa: S108 - the guest's path, moved
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    subprocess.run(["sh", "-c", script], env=env, check=True, timeout=60)
    return console.read_text().splitlines()


def test_the_probe_prints_what_the_verdict_reads(tmp_path):
    """Each key's value (the userdata by hash), the credentials, the import's result; the verdict passes."""
    lines = _run_probe(tmp_path, VALUES)
    assert lines[0] == f"{CONSOLE} import=success state=inactive"
    assert lines[-1] == f"{CONSOLE} done"
    found = read_console(["[   88.1] cloud-init[9]: " + line for line in lines])  # as the console shows them
    assert found["summary"].strip() == "Vendor: amazon-ec2"
    assert found["journal"] == ["[ 12.3] systemd[1]: Starting systemd-imds-import.service"]  # the IMDS lines only
    assert found["keys"]["ipv6-public"]["value"] == "2001:db8:ec2::7"
    assert found["keys"]["userdata"]["value"] is None
    assert found["keys"]["userdata"]["sha256"] == hashlib.sha256(USERDATA).hexdigest()
    assert found["credentials"] == {"firstboot.hostname": "lab-guest", "ssh.authorized_keys.root": KEY + "\n"}
    judged = verdict(lines, SERVED, EXPECTED, USERDATA)
    assert (judged["passed"], judged["problems"]) == (True, [])


@pytest.mark.parametrize(("change", "problem"), [
    ({"failing": "ipv6-public"}, "key ipv6-public: not read"),
    ({"values": {**VALUES, "zone": "lab2"}}, "key zone: 'lab2', not 'lab1'"),
    ({"values": {**VALUES, "userdata": "other"}}, "key userdata: 5 bytes"),
])
def test_the_verdict_fails_on_each_wrong_key(tmp_path, change, problem):
    """A key systemd could not read, or read with another value, fails the run and says which."""
    lines = _run_probe(tmp_path, change.get("values", VALUES), failing=change.get("failing"))
    judged = verdict(lines, SERVED, EXPECTED, USERDATA)
    assert not judged["passed"]
    assert any(p.startswith(problem) for p in judged["problems"]), judged["problems"]


def test_the_verdict_needs_the_credentials_the_import_and_serve_s_log(tmp_path):
    """A missing credential, a failed import, a key serve never answered, systemd-imds absent: each fails."""
    lines = _run_probe(tmp_path, VALUES)
    no_cred = [line for line in lines if "credential=firstboot.hostname" not in line]
    assert "credential firstboot.hostname: None, not 'lab-guest'" in verdict(no_cred, SERVED, EXPECTED,
                                                                             USERDATA)["problems"]
    failed = [line.replace("import=success", "import=exit-code") for line in lines]
    assert not verdict(failed, SERVED, EXPECTED, USERDATA)["passed"]
    cached = [r for r in SERVED if r["path"] != "/latest/meta-data/ipv6"]
    assert verdict(lines, cached, EXPECTED, USERDATA)["problems"] == [
        "serve never answered /latest/meta-data/ipv6 with 200"]
    missing = verdict([f"{CONSOLE} missing"], SERVED, EXPECTED, USERDATA)
    assert missing["problems"][0].startswith("systemd-imds is not in the guest")


def test_the_probe_is_a_shell_script_part_before_the_marker():
    """A text/x-shellscript part named to run before the lab's marker script (cloud-init sorts them by name)."""
    from email import message_from_bytes  # noqa: PLC0415 - the test's MIME reader

    assert SCRIPT < MARKER_SCRIPT
    parts = [(p.get_filename(), p.get_content_type(), p.get_payload(decode=True))
             for p in message_from_bytes(lab_userdata(b"#!/bin/sh\ntrue\n", "M", [(SCRIPT, guest_script())])).walk()
             if not p.is_multipart()]
    assert [(name, kind) for name, kind, _ in parts] == [
        ("part-001", "text/x-shellscript"), (SCRIPT, "text/x-shellscript"), (MARKER_SCRIPT, "text/x-shellscript")]
    assert parts[1][2] == guest_script().encode()


def test_what_the_lab_cannot_judge_is_refused(tmp_path):
    """Not EC2 (no SMBIOS entry the lab sets), IPv6-only (systemd asks 169.254.169.254), --url: refused."""
    def options(name: str, **extra: Any) -> Options:
        return Options(name, tmp_path / "run", "lab-guest", Image(tmp_path / "disk"), systemd_imds=True, **extra)

    assert refusal(options("ec2")) is None
    for refused in (options("openstack"), options("nocloud"), options("ec2", ipv6_only=True),
                    options("ec2", url="http://127.0.0.1:1")):
        reason = refusal(refused)
        assert reason is not None
        assert reason.startswith("--systemd-imds:")


def test_sid_gets_dhcpcd_where_isc_dhcp_client_left():
    """The recipe's package list stays; what sid installs replaces isc-dhcp-client (and its key says so)."""
    sid = Recipe("sid", ("systemd-imds",))
    assert "isc-dhcp-client" in sid.packages
    assert "isc-dhcp-client" not in sid.installed
    assert "dhcpcd-base" in sid.installed
    assert sid.describe()["installed"] == sid.installed
    assert "installed" not in Recipe().describe()
    assert Recipe("trixie").installed == Recipe("trixie").packages
