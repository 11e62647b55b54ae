"""QEMU for one guest: KVM when it works, TCG otherwise, never a hang.

``/dev/kvm`` may exist where KVM still cannot run the guest: nested virtualisation stops with
"KVM internal error ... emulation failure" (QEMU then pauses the VM and keeps running), or the
vCPU never gets anywhere and the console stays empty. ``Qemu.kvm_failure`` watches QEMU's
stderr for those words, for an early exit, and for a console still empty ``KVM_PROBE``
seconds after power-on (a kernel under KVM prints its banner within a second or two); the
caller then starts again under TCG. The guest's disk is a copy-on-write overlay on the image (the cached
image is never written), its NIC a tap the lab created (``vnet_hdr=off``: the userspace
datapath cannot take offloaded checksums) in the run's network namespace, which QEMU is
started in (``Machine.enter``), its serial console a file.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from imds.errors import LabError
from imds.lab.image import Image
from imds.lab.run import sh, spawn, stop, tool_env

QEMU = "qemu-system-x86_64"
KVM_FAILURES = ("KVM internal error", "emulation failure", "failed to initialize kvm", "Could not access KVM",
                "kvm run failed")
KVM_PROBE = 15.0
TAGGED_SLOT = 7  # the tagged disk's PCI slot (QEMU gives the NIC and the -drive disks 2 onwards)


def kvm_usable() -> bool:
    """Whether trying KVM makes sense (the device exists and we may open it)."""
    return os.access("/dev/kvm", os.R_OK | os.W_OK)


def accelerators(choice: str) -> list[str]:
    """What to try, in order: ``auto`` is KVM then TCG (TCG alone when /dev/kvm is unusable)."""
    if choice == "auto":
        return ["kvm", "tcg"] if kvm_usable() else ["tcg"]
    return [choice]


@dataclass(frozen=True)
class Machine:
    """Everything QEMU is told about the guest."""

    image: Image
    out: Path
    tap: str
    mac: str
    kernel_args: tuple[str, ...] = ()
    smbios: str | None = None
    cdrom: Path | None = None  # a config drive (attached as a read-only virtio disk)
    second_disk: Path | None = None  # a raw disk right after the root one (/dev/vdb): --ganeti-install's target
    tagged_disk: tuple[Path, str] | None = None  # (raw file, virtio serial): --device-tags' data disk
    qmp: Path | None = None  # a QMP socket (--hotplug attaches devices through it)
    enter: tuple[str, ...] = ()  # the prefix that starts QEMU where its taps are (the run's namespace)
    smbios_extra: tuple[str, ...] = ()  # more -smbios values (type=0 for the BIOS vendor systemd-imds matches)
    memory_mb: int = 1024
    cpus: int = 2

    @property
    def serial(self) -> Path:
        """The console log."""
        return self.out / "serial.log"

    @property
    def overlay(self) -> Path:
        """The guest's writable disk, backed by the image."""
        return self.out / "disk.qcow2"

    def command(self, accel: str) -> list[str]:
        """QEMU's argument list under ``accel``."""
        args = [QEMU, "-name", f"imds-lab-{self.tap}", "-nodefaults", "-display", "none", "-no-reboot",
                "-accel", accel, "-m", str(self.memory_mb), "-smp", str(self.cpus),
                "-serial", f"file:{self.serial}",
                "-drive", f"file={self.overlay},if=virtio,format=qcow2",
                *(("-drive", f"file={self.second_disk},if=virtio,format=raw") if self.second_disk else ()),
                # -drive takes no serial; slot 7, after the ones QEMU picks, keeps the root disk /dev/vda
                *(("-drive", f"file={self.tagged_disk[0]},if=none,id=tagged,format=raw",
                   "-device", f"virtio-blk-pci,drive=tagged,serial={self.tagged_disk[1]},addr={TAGGED_SLOT:#x}")
                  if self.tagged_disk else ()),
                "-netdev", f"tap,id=net0,ifname={self.tap},script=no,downscript=no,vnet_hdr=off",
                "-device", f"virtio-net-pci,netdev=net0,mac={self.mac}"]
        if accel == "kvm":
            args += ["-cpu", "host"]
        if self.qmp is not None:
            args += ["-qmp", f"unix:{self.qmp},server=on,wait=off"]
        if self.smbios:
            args += ["-smbios", self.smbios]
        for extra in self.smbios_extra:
            args += ["-smbios", extra]
        if self.cdrom is not None:
            args += ["-drive", f"file={self.cdrom},if=virtio,format=raw,readonly=on"]
        if self.image.kernel is not None and self.image.initrd is not None:
            append = ["root=/dev/vda", "rw", "console=ttyS0", "panic=1", *self.kernel_args]
            args += ["-kernel", str(self.image.kernel), "-initrd", str(self.image.initrd), "-append", " ".join(append)]
        return args


class Qemu:
    """One QEMU process for a ``Machine``; started again from a fresh overlay on each ``start``."""

    def __init__(self, machine: Machine) -> None:
        """Nothing runs until ``start``."""
        self.machine = machine
        self.process: subprocess.Popen[bytes] | None = None
        self.accel = ""
        self.started = 0.0
        self.stderr = machine.out / "qemu.stderr"

    def start(self, accel: str) -> None:
        """A fresh overlay and console log, then QEMU under ``accel``."""
        if shutil.which(QEMU, path=tool_env()["PATH"]) is None:
            raise LabError(f"{QEMU} is missing: apt-get install qemu-system-x86 qemu-utils (scripts/test does)")
        self.stop()
        machine = self.machine
        for stale in (machine.serial, self.stderr, machine.qmp):
            if stale is not None:
                stale.unlink(missing_ok=True)
        self.overlay()
        self.accel = accel
        self.started = time.monotonic()
        command = [*machine.enter, *machine.command(accel)]
        (machine.out / "qemu.cmd").write_text(" ".join(command) + "\n")
        self.process = spawn(command, machine.out / "qemu.stdout", stderr=self.stderr)

    def overlay(self) -> Path:
        """A fresh qcow2 overlay backed by the image (raw or any format ``qemu-img`` names): QEMU writes only it."""
        machine = self.machine
        machine.overlay.unlink(missing_ok=True)
        sh("qemu-img", "create", "-q", "-f", "qcow2", "-F", machine.image.format, "-b",
           str(machine.image.disk.resolve()), str(machine.overlay))
        return machine.overlay

    def errors(self) -> str:
        """What QEMU wrote to stderr so far."""
        return self.stderr.read_text(errors="replace") if self.stderr.exists() else ""

    def exited(self) -> int | None:
        """QEMU's exit status once it has exited."""
        return None if self.process is None else self.process.poll()

    def kvm_failure(self) -> str | None:
        """Under KVM: why KVM cannot run this guest (QEMU said so, died, or the console stayed empty); else None."""
        if self.accel != "kvm":
            return None
        text = self.errors()
        for sign in KVM_FAILURES:
            if sign in text:
                return next(line.strip() for line in text.splitlines() if sign in line)
        if self.exited() not in (None, 0):
            return f"qemu exited {self.exited()}: {text.strip()[-300:]}"
        silent = not self.machine.serial.exists() or self.machine.serial.stat().st_size == 0
        if silent and time.monotonic() - self.started > KVM_PROBE:
            return f"no console output {KVM_PROBE:.0f}s after power-on"
        return None

    def stop(self) -> None:
        """Stop QEMU by PID (bounded)."""
        if self.process is not None:
            stop(self.process)
            self.process = None
