"""Fake ``/sys`` and ``/dev`` trees shaped like the kernel's, for tests of ``imds guest``.

Devices live under ``sys/devices/…``; ``sys/class/net``, ``sys/block``, ``sys/class/block``,
``sys/bus/pci/devices``, ``sys/class/scsi_disk`` and ``dev/disk/by-id`` are relative
symlinks into it, as on a real machine, so code that works here resolves real paths the
same way.

Usage::

    fake = FakeSystem(tmp_path)
    fake.pci_nic("eth0", "fa:16:3e:00:00:01", "0000:00:03.0")
    fake.virtio_disk("vdb", "0000:00:07.0", serial="vol-1")
    main(["udev", "--sysfs-root", str(fake.sys), "--dev-root", str(fake.dev), "--dry-run", …])

    with MetadataServer() as server:
        server.routes["/openstack/latest/meta_data.json"] = (200, b'{"devices": []}')
        main(["udev", "--metadata-url", server.url, …])
"""

from __future__ import annotations

import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Self

QEMU_SCSI_MODEL = "0QEMU_QEMU_HARDDISK"


class FakeSystem:
    """Builds devices under ``root/sys`` and ``root/dev``; every method returns the device directory."""

    def __init__(self, root: Path) -> None:
        self.sys = root / "sys"
        self.dev = root / "dev"
        self._virtio = 0
        for directory in ("class/net", "block", "class/block", "bus/pci/devices", "class/scsi_disk"):
            (self.sys / directory).mkdir(parents=True, exist_ok=True)
        (self.dev / "disk" / "by-id").mkdir(parents=True, exist_ok=True)

    # Network interfaces

    def pci_nic(self, name: str, mac: str, pci: str, *, virtio: bool = True) -> Path:
        """A NIC at PCI function ``pci``: virtio-net (``…/virtioN/net/<name>``) or a plain PCI NIC."""
        parent = self._virtio_device(pci) if virtio else self._pci_device(pci)
        return self._net(parent / "net" / name, mac, device=parent)

    def xen_nic(self, name: str, mac: str, vif: int) -> Path:
        """A Xen netfront NIC: ``/sys/devices/vif-<vif>/net/<name>``."""
        parent = self.sys / "devices" / f"vif-{vif}"
        return self._net(parent / "net" / name, mac, device=parent)

    def virtual_nic(self, name: str, mac: str) -> Path:
        """An interface with no device behind it (veth in a container, bridge, bond)."""
        return self._net(self.sys / "devices" / "virtual" / "net" / name, mac, device=None)

    def _net(self, directory: Path, mac: str, *, device: Path | None) -> Path:
        directory.mkdir(parents=True)
        (directory / "address").write_text(f"{mac}\n")
        if device is not None:
            _link(directory / "device", device)
        _link(self.sys / "class" / "net" / directory.name, directory)
        return directory

    # Disks

    def virtio_disk(self, name: str, pci: str, *, serial: str | None = None) -> Path:
        """A virtio-blk disk at ``pci``; the guest sees at most 20 characters of ``serial``."""
        parent = self._virtio_device(pci)
        directory = self._block(parent / "block" / name, device=parent)
        if serial is not None:
            (directory / "serial").write_text(f"{serial[:20]}\n")
            self.by_id(f"virtio-{serial[:20]}", name)
        return directory

    def scsi_disk(self, name: str, hctl: str, *, controller: str = "0000:00:05.0", serial: str | None = None) -> Path:
        """A disk at SCSI ``hctl`` behind a virtio-scsi controller; the serial is in VPD page 0x80."""
        host, channel, target, _ = hctl.split(":")
        parent = self._virtio_device(controller) / f"host{host}" / f"target{host}:{channel}:{target}" / hctl
        directory = self._block(parent / "block" / name, device=parent)
        scsi_disk = parent / "scsi_disk" / hctl
        scsi_disk.mkdir(parents=True)
        _link(scsi_disk / "device", parent)
        _link(self.sys / "class" / "scsi_disk" / hctl, scsi_disk)
        if serial is not None:
            data = serial.encode()
            (parent / "vpd_pg80").write_bytes(bytes([0, 0x80, 0, len(data)]) + data)
            self.by_id(f"scsi-{QEMU_SCSI_MODEL}_{serial}", name)
        return directory

    def xen_disk(self, name: str, vbd: int) -> Path:
        """A Xen blkfront disk (``/sys/devices/vbd-<vbd>/block/<name>``): no serial."""
        parent = self.sys / "devices" / f"vbd-{vbd}"
        return self._block(parent / "block" / name, device=parent)

    def partition(self, disk: str, number: int) -> Path:
        """Partition ``number`` of ``disk``: in class/block, never in /sys/block."""
        directory = Path(os.path.realpath(self.sys / "block" / disk)) / f"{disk}{number}"
        directory.mkdir()
        (directory / "partition").write_text(f"{number}\n")
        _link(self.sys / "class" / "block" / directory.name, directory)
        (self.dev / directory.name).touch()
        return directory

    def _block(self, directory: Path, *, device: Path) -> Path:
        directory.mkdir(parents=True)
        _link(directory / "device", device)
        _link(self.sys / "block" / directory.name, directory)
        _link(self.sys / "class" / "block" / directory.name, directory)
        (self.dev / directory.name).touch()
        return directory

    # /dev

    def by_id(self, link_name: str, disk: str) -> Path:
        """``/dev/disk/by-id/<link_name>`` → ``/dev/<disk>``."""
        link = self.dev / "disk" / "by-id" / link_name
        _link(link, self.dev / disk)
        return link

    def by_label(self, label: str, disk: str) -> Path:
        """``/dev/disk/by-label/<label>`` → ``/dev/<disk>`` (a config drive is ``config-2``)."""
        link = self.dev / "disk" / "by-label" / label
        link.parent.mkdir(parents=True, exist_ok=True)
        (self.dev / disk).touch()
        _link(link, self.dev / disk)
        return link

    # PCI

    def _pci_device(self, pci: str) -> Path:
        directory = self.sys / "devices" / f"pci{pci[:7]}" / pci
        directory.mkdir(parents=True, exist_ok=True)
        link = self.sys / "bus" / "pci" / "devices" / pci
        if not link.is_symlink():
            _link(link, directory)
        return directory

    def _virtio_device(self, pci: str) -> Path:
        pci_dir = self._pci_device(pci)
        existing = sorted(pci_dir.glob("virtio*"))
        if existing:
            return existing[0]
        directory = pci_dir / f"virtio{self._virtio}"
        self._virtio += 1
        directory.mkdir()
        return directory


def _link(link: Path, target: Path) -> None:
    """A relative symlink, as sysfs makes them, so the tree can move."""
    link.symlink_to(os.path.relpath(target, link.parent))


class MetadataServer:
    """A metadata URL on 127.0.0.1 (a free port), served from a thread while the ``with`` block runs.

    ``routes`` maps a path to ``(status, body)``; other paths are 404. A path in ``stalled``
    answers only when the server stops (for timeouts). ``requests`` lists the paths asked for.
    """

    def __init__(self) -> None:
        self.routes: dict[str, tuple[int, bytes]] = {}
        self.stalled: set[str] = set()
        self.requests: list[str] = []
        self._release = threading.Event()
        self._server = _QuietServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, name="metadata-server", daemon=True
        )

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self._release.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.requests.append(self.path)
                if self.path in server.stalled:
                    server._release.wait(timeout=30)
                status, body = server.routes.get(self.path, (404, b"not found"))
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the stdlib's name
                """Silent: tests read ``requests`` instead."""

        return Handler


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        """A client that timed out and left is expected here, not an error to print."""
