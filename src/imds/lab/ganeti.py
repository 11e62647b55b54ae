"""``imds lab boot --ganeti-install``: the guest installs an OS image onto its second disk through imds's Ganeti paths.

What a Ganeti install appliance does (docs/ganeti.md, "The installation, end to end"), done by
a real guest against the lab's own ``imds serve``:

- the lab builds a small ext4 image in ``RUN/ganeti-images`` with ``mke2fs -d`` (no mount, no
  network): one file, ``/imds-lab-installed``, holding the instance id; ``imds serve`` gets
  ``--ganeti-os-image-dir RUN/ganeti-images`` so that node path may be served as ``os/image``;
- QEMU gets a second, empty disk (``RUN/disk2.raw``, sparse, virtio: ``/dev/vdb`` in the guest);
- the instance gets an OS record in mode ``install`` whose public parameter ``os-image`` is the
  image's node path (no OS definition: the guest tool then runs no ``create``);
- the userdata gets one more shell-script part (sorted before the lab's marker script) carrying
  the guest tool's zipapp (built as docs/guest.md builds it) in base64; it runs ``imds-guest
  ganeti install --disk /dev/vdb`` and prints ``LAB-GANETI exit=N`` to the console.

The run passes only if the console shows exit 0, the instance's events (``GET
/device-events/{id}``) went ``started``, ``image`` …, ``succeeded`` and then the service's own
``mode`` event (``run``), the OS record is back in ``run``, and, once QEMU has stopped, the
second disk holds the marker (read with ``debugfs``, nothing mounted): ``verdict``.
"""

from __future__ import annotations

import base64
import shutil
import tempfile
import zipapp
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path
from typing import Any

import imds
from imds.errors import LabError
from imds.lab.run import sh
from imds.lab.server import Server

CONSOLE = "LAB-GANETI"  # the console line: "LAB-GANETI exit=N"
SCRIPT = "zy-imds-lab-ganeti.sh"  # cloud-init runs user scripts sorted by name: before zz-imds-lab-marker.sh
IMAGE_DIR = "ganeti-images"
IMAGE = "lab-root.ext4"
IMAGE_SIZE = "4M"  # mke2fs's size: a filesystem with one small file, streamed in well under a second
MARKER_FILE = "imds-lab-installed"
DISK = "disk2.raw"
DISK_BYTES = 64 * 1024 * 1024  # sparse: nothing is allocated until the guest writes the image
GUEST_DISK = "/dev/vdb"
GUEST_TOOL = "/root/imds-guest.pyz"
OS_TYPE = "imds-lab"
STATES = ("started", "image", "succeeded", "mode")  # in this order; "mode" is the service's own event
SHIPPED_LEAVES = ("__init__.py", "tarball.py")  # what imds.guest imports from outside itself
ENTRY = "import sys\nfrom imds.guest.cli import main\nsys.exit(main())\n"  # docs/guest.md's __main__.py


def guest_zipapp() -> bytes:
    """The guest tool as one file, built as docs/guest.md says: ``imds/{__init__,tarball}.py``, ``imds/guest/*.py``."""
    package = Path(imds.__file__).parent
    with tempfile.TemporaryDirectory(prefix="imds-lab-zipapp-") as work:
        tree = Path(work) / "imds-guest"
        (tree / "imds" / "guest").mkdir(parents=True)
        for leaf in SHIPPED_LEAVES:
            shutil.copy(package / leaf, tree / "imds" / leaf)
        for module in sorted((package / "guest").glob("*.py")):
            shutil.copy(module, tree / "imds" / "guest" / module.name)
        (tree / "__main__.py").write_text(ENTRY)
        archive = BytesIO()
        zipapp.create_archive(tree, archive, interpreter="/usr/bin/python3", compressed=True)
    return archive.getvalue()


def guest_script(tool: bytes, url: str) -> str:
    """The userdata part: write the zipapp, install onto the second disk, print the exit status to the console."""
    end = "IMDS_GUEST_PYZ"
    encoded = base64.encodebytes(tool).decode()
    return (
        "#!/bin/sh\n"
        "# imds lab --ganeti-install: install os-image onto the second disk through imds's Ganeti paths\n"
        f"base64 -d > {GUEST_TOOL} <<'{end}'\n{encoded}{end}\n"
        f"python3 {GUEST_TOOL} ganeti install --disk {GUEST_DISK} --url {url} > /dev/ttyS0 2>&1\n"
        f'echo "{CONSOLE} exit=$?" > /dev/ttyS0\n'
    )


def os_record(instance_id: str, image: Path) -> dict[str, Any]:
    """``POST /device-os``: the instance in ``install`` mode, ``os-image`` the image's node path."""
    return {"id": instance_id, "os_type": OS_TYPE, "mode": "install", "communication": False,
            "parameters": {"os-image": {"value": str(image), "visibility": "public"}}}


@dataclass(frozen=True)
class Install:
    """The run directory's side of ``--ganeti-install``: the image, the second disk, what serve is told."""

    out: Path

    @property
    def image_dir(self) -> Path:
        """The only directory ``imds serve`` may serve node images from."""
        return (self.out / IMAGE_DIR).resolve()

    @property
    def image(self) -> Path:
        """The ext4 image the guest installs."""
        return self.image_dir / IMAGE

    @property
    def disk(self) -> Path:
        """QEMU's second disk (``/dev/vdb`` in the guest)."""
        return self.out / DISK

    def serve_args(self) -> list[str]:
        """What the lab's own ``imds serve`` is started with."""
        return ["--ganeti-os-image-dir", str(self.image_dir)]

    def build_image(self, instance_id: str) -> Path:
        """``mke2fs -t ext4 -d``: a small filesystem whose ``/imds-lab-installed`` names the instance."""
        source = self.out / "ganeti-image-root"
        shutil.rmtree(source, ignore_errors=True)
        source.mkdir(parents=True)
        (source / MARKER_FILE).write_text(f"{instance_id}\n")
        self.image_dir.mkdir(parents=True, exist_ok=True)
        self.image.unlink(missing_ok=True)
        sh("mke2fs", "-q", "-F", "-t", "ext4", "-L", "imds-lab", "-d", str(source), str(self.image), IMAGE_SIZE)
        shutil.rmtree(source)
        return self.image

    def disk_marker(self) -> str | None:
        """The marker file read from the second disk without mounting it (``debugfs``); None when absent."""
        if not self.disk.exists():
            return None
        try:
            text = sh("debugfs", "-R", f"cat /{MARKER_FILE}", str(self.disk), timeout=30.0)
        except LabError:
            return None
        return text or None


def fresh_disk(path: Path, size: int = DISK_BYTES) -> Path:
    """An empty sparse raw disk of ``size`` bytes at ``path`` (what was there is dropped)."""
    path.unlink(missing_ok=True)
    with path.open("wb") as disk:
        disk.truncate(size)
    return path


def _in_order(wanted: tuple[str, ...], states: list[str]) -> bool:
    """Whether ``wanted`` appears in ``states`` in that order (other states may come between)."""
    remaining = iter(states)
    return all(state in remaining for state in wanted)


def verdict(exit_status: int | None, events: list[dict[str, Any]], mode: str | None, disk_marker: str | None,
            instance_id: str) -> dict[str, Any]:
    """``result.json``'s ``ganeti_install``: what was seen, the problems, and whether it passed."""
    states = [str(event.get("state")) for event in events]
    mode_events = [event for event in events if event.get("state") == "mode"]
    problems = []
    if exit_status != 0:
        problems.append("the console shows no install" if exit_status is None else
                        f"imds-guest ganeti install exited {exit_status}")
    if not _in_order(STATES, states):
        problems.append(f"events {states}: not {', '.join(STATES)} in order")
    if not mode_events or mode_events[-1].get("message") != "run":
        problems.append("no mode event saying run")
    if mode != "run":
        problems.append(f"the OS record is in mode {mode}, not run")
    if disk_marker != f"{instance_id}\n":
        problems.append(f"the second disk's /{MARKER_FILE} holds {disk_marker!r}, not the instance id")
    return {"passed": not problems, "exit": exit_status, "events": states, "mode": mode,
            "disk_marker": disk_marker, "problems": problems}


@dataclass
class Installing:
    """One run's install against its server: set up before each power-on, judged after QEMU stopped."""

    install: Install
    server: Server
    instance_id: str
    cursor: int = 0  # the instance's events up to here came before this power-on

    def prepare(self) -> None:
        """Before each power-on: an empty second disk, the OS record (again) in install mode, the cursor noted."""
        fresh_disk(self.install.disk)
        self.server.post("/device-os", os_record(self.instance_id, self.install.image))
        self.cursor = int(self.server.get(f"/device-events/{self.instance_id}", {"after": 0})["cursor"])

    def verdict(self, exit_status: int | None) -> dict[str, Any]:
        """``verdict`` on this power-on's events, the record's mode now and the second disk's marker."""
        events = self.server.get(f"/device-events/{self.instance_id}", {"after": self.cursor})["events"]
        mode = self.server.get(f"/device-os/{self.instance_id}").get("mode")
        return verdict(exit_status, events, mode, self.install.disk_marker(), self.instance_id)
