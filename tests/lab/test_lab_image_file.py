"""``imds lab boot --image FILE``: the operator's disk image is booted through an overlay, never written.

No guest is booted here (bench/lab_matrix.py boots real images): the command must hand the
file itself to the boot, unbuilt and with no kernel of the lab's (the image boots with its own
bootloader), and QEMU's disk must be a qcow2 overlay backed by FILE, raw or qcow2, so that what
the guest writes lands in the overlay and FILE keeps every byte.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from imds.cli import cli
from imds.lab import boot as lab_boot
from imds.lab import image as lab_image
from imds.lab.image import Image
from imds.lab.qemu import Machine, Qemu


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _image(tmp_path: Path, fmt: str) -> Path:
    """A 4 MiB disk of known bytes, raw or converted to qcow2."""
    raw = tmp_path / "disk.raw"
    raw.write_bytes(bytes(range(256)) * (4 << 12))
    if fmt == "raw":
        return raw
    qcow = tmp_path / "disk.qcow2"
    subprocess.run(["qemu-img", "convert", "-q", "-f", "raw", "-O", "qcow2", str(raw), str(qcow)], check=True)
    return qcow


def _qemu_io(*args: str) -> str:
    done = subprocess.run(["qemu-io", *args], capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "failed" not in done.stdout.lower(), done.stdout
    return done.stdout


@pytest.mark.parametrize("fmt", ["raw", "qcow2"])
def test_image_file_is_used_through_an_overlay_and_never_written(tmp_path: Path, fmt: str) -> None:
    """The overlay is backed by FILE in its own format; a write through it leaves FILE unchanged."""
    disk = _image(tmp_path, fmt)
    before = _digest(disk)
    run = tmp_path / "run"
    run.mkdir()
    machine = Machine(Image(disk), run, "lvm0001", "52:54:00:00:00:01")
    overlay = Qemu(machine).overlay()

    info = json.loads(subprocess.run(["qemu-img", "info", "--output=json", str(overlay)], capture_output=True,
                                     text=True, check=True).stdout)
    assert info["format"] == "qcow2"
    assert info["backing-filename"] == str(disk.resolve())
    assert info["backing-filename-format"] == fmt
    command = machine.command("tcg")
    assert f"file={overlay},if=virtio,format=qcow2" in command
    assert not any(str(disk) in arg for arg in command)  # QEMU never opens FILE itself
    assert "-kernel" not in command  # FILE boots with its own bootloader

    _qemu_io("-f", "qcow2", "-c", "write -P 0xaa 0 64k", str(overlay))
    _qemu_io("-f", "qcow2", "-r", "-c", "read -P 0xaa 0 64k", str(overlay))  # the guest reads what it wrote
    assert _digest(disk) == before
    _qemu_io("-f", fmt, "-r", "-c", "read -P 0x00 0 1", str(disk))  # FILE still starts with its own byte


def test_cli_boots_the_file_given_and_builds_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--image FILE`` reaches the boot as that file, with no kernel, and no image is built."""
    disk = _image(tmp_path, "qcow2")
    seen: list[Any] = []

    def no_build(*_args: object) -> Image:
        pytest.fail("--image FILE must not build the lab's image")

    def fake_boot(options: lab_boot.Options, _say: object) -> dict[str, Any]:
        seen.append(options)
        return {"passed": True}

    monkeypatch.setattr(lab_image, "build", no_build)
    monkeypatch.setattr(lab_boot, "boot", fake_boot)
    result = CliRunner().invoke(cli, ["lab", "boot", "--flavor", "nocloud", "--image", str(disk),
                                      "--out", str(tmp_path / "run")], prog_name="imds")
    assert result.exit_code == 0, result.output
    (options,) = seen
    assert options.image == Image(disk.resolve())
    assert options.image.kernel is None
    assert options.image.format == "qcow2"


def test_cli_refuses_an_ipv6_only_flavor_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--ipv6-only`` with OpenStack: exit 2 naming the flavor and why, before any build or boot."""
    monkeypatch.setattr(lab_image, "build", lambda *_a: pytest.fail("refused runs build nothing"))
    monkeypatch.setattr(lab_boot, "boot", lambda *_a: pytest.fail("refused runs boot nothing"))
    result = CliRunner().invoke(cli, ["lab", "boot", "--flavor", "openstack", "--ipv6-only",
                                      "--out", str(tmp_path / "run")], prog_name="imds")
    assert result.exit_code == 2
    assert "flavor openstack" in result.output
    assert "169.254.169.254" in result.output
    assert not (tmp_path / "run").exists()
    routed = CliRunner().invoke(cli, ["lab", "boot", "--flavor", "ec2", "--ipv6-only", "--route", "onlink",
                                      "--out", str(tmp_path / "run")], prog_name="imds")
    assert routed.exit_code == 2
    assert "--route onlink" in routed.output
