"""``imds-guest ganeti install`` end to end: Ganeti's client pushes, the zipapp installs onto a loop device.

As root (fails loudly otherwise, never skips). Debian's ``ganeti.metad.Client`` pushes an
instance whose communication NIC's address is inside a network namespace the test creates
(a veth pair on a /30 of 198.19.0.0/16, a benchmarking range nothing routes) to ``imds
serve --ganeti-metad-socket``; the admin API puts its OS record in ``install`` mode with
``os-image`` (an ext4 image made by ``mke2fs -d``, holding a marker file) and ``os-package``
(a tar.gz adding a second file), both served by a local HTTP server that imds fetches. The
zipapp docs/guest.md builds runs inside the namespace on the system python (``-I -S``:
nothing but the standard library) against a loop device; the OS definition's ``create``
mounts ``$DISK_0_PATH`` and writes ``$INSTANCE_NAME`` and ``$OSP_GREETING`` there. The
disk then holds all three files, the events came in order, and the record is back in
``run``. Everything is removed in ``finally`` blocks, processes stopped by PID.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import shutil
import subprocess
import tarfile
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from fake_upstream import FakeUpstream, running_upstream
from ganeti_metad import SOCKET, node_root, push, require_ganeti
from guest_zipapp import build_documented_zipapp
from helpers import LOOPBACK_FETCH_ARGS
from netns_guest import Guest, netns_guest, run
from serve_process import Server, serving

SYSTEM_PYTHON = "/usr/bin/python3"
TOOLS = ("ip", "losetup", "mke2fs", "mount", "umount")
GREETING = "hello from the 'install' $HOME"
CREATE = """#!/bin/sh
# exits OSP_EXIT_STATUS when set; OSP_WIPE: zeroes the start of DISK_0_PATH (no filesystem left) and exits 0;
# OSP_FORMAT: makes a new ext4 filesystem on DISK_0_PATH first (as an installer that formats does);
# then writes INSTANCE_NAME and OSP_GREETING onto DISK_0_PATH's filesystem (or OSP_ROOT_DEVICE's)
set -eu
if [ -n "${OSP_EXIT_STATUS:-}" ]; then echo "failing on purpose" >&2; exit "$OSP_EXIT_STATUS"; fi
if [ -n "${OSP_WIPE:-}" ]; then dd if=/dev/zero of="$DISK_0_PATH" bs=1M count=4 conv=fsync 2>/dev/null; exit 0; fi
if [ -n "${OSP_FORMAT:-}" ]; then mke2fs -q -F -t ext4 -L formatted "$DISK_0_PATH"; fi
mnt=$(mktemp -d)
mount "${OSP_ROOT_DEVICE:-$DISK_0_PATH}" "$mnt"
printf '%s\\n%s\\n' "$INSTANCE_NAME" "$OSP_GREETING" > "$mnt/created-by-script"
umount "$mnt"
rmdir "$mnt"
"""
PARAMETERS = ("os-image", "os-package", "greeting", "exit-status", "root-device", "format", "wipe")


@pytest.fixture(autouse=True)
def as_root() -> None:
    """Loop devices, mounts and network namespaces need root and their tools: fail, never skip."""
    if os.geteuid() != 0:
        pytest.fail("test_guest_ganeti_install needs root (loop devices, mounts, network namespaces)")
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        pytest.fail(f"missing tools: {', '.join(missing)}")
    require_ganeti()


@pytest.fixture
def guest() -> Iterator[Guest]:
    with netns_guest("gn", 19) as made:
        yield made


@pytest.fixture
def base() -> Iterator[Path]:
    """A short temp dir (the Ganeti socket's path must fit 108 bytes), removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="gni-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@contextmanager
def loop_device(backing: Path) -> Iterator[str]:
    """A 32 MiB sparse file ``backing`` behind a loop device; detached afterwards."""
    with backing.open("wb") as file:
        file.truncate(32 * 1024 * 1024)
    device = run("losetup", "-f", "--show", str(backing)).stdout.strip()
    try:
        yield device
    finally:
        run("losetup", "-d", device, check=False)


@pytest.fixture
def loop(base: Path) -> Iterator[str]:
    with loop_device(base / "disk.img") as device:
        yield device


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    with running_upstream() as fake:
        yield fake


def os_definitions(base: Path) -> Path:
    """``<base>/os/imds-test``: Ganeti's layout; only ``create`` does something."""
    definition = base / "os" / "imds-test"
    definition.mkdir(parents=True)
    for name, script in (("create", CREATE), ("export", "#!/bin/sh\n"), ("import", "#!/bin/sh\n"),
                         ("rename", "#!/bin/sh\n")):
        (definition / name).write_text(script)
        (definition / name).chmod(0o755)
    (definition / "ganeti_api_version").write_text("20\n")
    (definition / "parameters.list").write_text("".join(f"{name} a parameter\n" for name in PARAMETERS))
    return definition.parent


def ext4_image(base: Path, *, marker: bool = True) -> bytes:
    """An 8 MiB ext4 filesystem (holding /marker), built without mounting anything."""
    source = base / ("image-root" if marker else "empty-root")
    source.mkdir()
    if marker:
        (source / "marker").write_text("from the image\n")
    image = base / f"{source.name}.img"
    run("mke2fs", "-q", "-F", "-t", "ext4", "-d", str(source), str(image), "8M")
    return image.read_bytes()


def package() -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        data = b"from the package\n"
        info = tarfile.TarInfo("etc/imds-package")
        info.size, info.mode = len(data), 0o644
        tar.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue(), mtime=0)


@contextmanager
def installing(base: Path, guest: Guest, parameters: dict[str, str], package_url: str | None) -> Iterator[
        tuple[Server, str]]:
    """`imds serve`; Ganeti's client pushes the instance; the admin API switches its OS record to ``install``."""
    root = node_root(base / "node")
    args = ("--db", f"sqlite:///{base / 'imds.db'}", "--os-definitions-dir", str(os_definitions(base)),
            "--ganeti-metad-socket", str(root / SOCKET), *LOOPBACK_FETCH_ARGS)
    with serving(base, *args, host=guest.host) as server:
        instance_id = str(uuid.uuid4())
        spec = {
            "instance": {"name": "vm1.example.com", "uuid": instance_id, "os": "imds-test", "primary_node": "node1",
                         "hypervisor": "kvm", "admin_state": "up", "admin_state_source": "admin",
                         "osparams": parameters},
            "nics": [{"name": f"ganeti:communication:{instance_id}", "ip": guest.address, "mac": "aa:00:00:00:00:02",
                      "uuid": str(uuid.uuid4())}],
        }
        assert push(root, spec) == {"echo": "ping", "result": []}
        assert record(server, instance_id)["mode"] == "run"  # what a Ganeti push gives: run, communication on
        body: dict[str, Any] = {
            "id": instance_id, "os_type": "imds-test", "mode": "install", "communication": True,
            "parameters": {name: {"value": value, "visibility": "public"} for name, value in parameters.items()},
        }
        if package_url is not None:
            body["package"] = {"url": package_url}
        server.post("/device-os", body)
        yield server, instance_id


def record(server: Server, instance_id: str) -> dict[str, Any]:
    with httpx.Client(timeout=10.0, trust_env=False) as admin:
        answer = admin.get(f"{server.url}/device-os/{instance_id}", headers=server.admin_headers)
    assert answer.status_code == 200, answer.text
    result: dict[str, Any] = answer.json()
    return result


def events(server: Server, instance_id: str) -> list[dict[str, Any]]:
    with httpx.Client(timeout=10.0, trust_env=False) as admin:
        answer = admin.get(f"{server.url}/device-events/{instance_id}", params={"after": 0},
                           headers=server.admin_headers)
    assert answer.status_code == 200, answer.text
    found: list[dict[str, Any]] = answer.json()["events"]
    return found


def guest_install(guest: Guest, zipapp: Path, server: Server, disk: str,
                  *args: str) -> subprocess.CompletedProcess[str]:
    """The zipapp on the system python, isolated, inside the namespace."""
    return run("ip", "netns", "exec", guest.netns, SYSTEM_PYTHON, "-I", "-S", str(zipapp), "ganeti", "install",
               "--disk", disk, "--url", server.url, *args, check=False, timeout=120)


def read_disk(device: str, mountpoint: Path, *names: str) -> list[Any]:
    """The files (a directory: its entries' names), read from the device mounted read-only on ``mountpoint``."""
    mountpoint.mkdir()
    run("mount", "-o", "ro", device, str(mountpoint))
    try:
        return [[p.name for p in (mountpoint / name).iterdir()] if (mountpoint / name).is_dir()
                else (mountpoint / name).read_text() for name in names]
    finally:
        run("umount", str(mountpoint), check=False)


@pytest.mark.parametrize("separate_root", [False, True], ids=["root-on-the-disk", "root-device"])
def test_install_writes_image_package_and_script_output(base, guest, loop, upstream, separate_root):
    """Every step onto the loop device; events in order; the record back in run mode.

    ``root-device``: the root filesystem is on another device (``--root-device``), which gets
    the package and create's file, while the image goes to the first disk.
    """
    upstream.answer("/images/root.img", 200, ext4_image(base), content_type="application/octet-stream")
    upstream.answer("/pkg/site.tar.gz", 200, package(), content_type="application/gzip")
    parameters = {"os-image": f"{upstream.base}/images/root.img", "os-package": f"{upstream.base}/pkg/site.tar.gz",
                  "greeting": GREETING}
    zipapp = build_documented_zipapp(base / "checkout")
    with contextlib.ExitStack() as stack:
        root = stack.enter_context(loop_device(base / "root.img")) if separate_root else loop
        if separate_root:
            Path(root).write_bytes(ext4_image(base, marker=False))
            parameters["root-device"] = root
        with installing(base, guest, parameters, parameters["os-package"]) as (server, instance_id):
            done = guest_install(guest, zipapp, server, loop, *(("--root-device", root) if separate_root else ()))
            assert done.returncode == 0, done.stderr
            posted = events(server, instance_id)
            mode = record(server, instance_id)["mode"]
        assert read_disk(loop, base / "disk", "marker") == ["from the image\n"]
        assert read_disk(root, base / "root", "etc/imds-package", "created-by-script") == [
            "from the package\n", f"vm1.example.com\n{GREETING}\n"]
    assert [e["state"] for e in posted if e["state"] != "mode"] == ["started", "image", "script", "package",
                                                                     "succeeded"]
    assert (posted[-1]["state"], posted[-1]["message"]) == ("mode", "run")  # the service's own: the mode ended
    assert mode == "run"


def test_failing_create_reports_its_status_and_keeps_the_mode(base, guest):
    """A create that exits 3: a failed event with code 3, exit status 1, the record still in install mode."""
    disk = base / "plain-disk.img"
    disk.write_bytes(b"")
    zipapp = build_documented_zipapp(base / "checkout")
    with installing(base, guest, {"exit-status": "3", "greeting": "x"}, None) as (server, instance_id):
        done = guest_install(guest, zipapp, server, str(disk))
        posted = events(server, instance_id)
        mode = record(server, instance_id)["mode"]
    assert done.returncode == 1, done.stderr
    assert "failing on purpose" in done.stderr
    assert [(e["state"], e.get("code")) for e in posted] == [("started", None), ("script", None), ("failed", 3)]
    assert mode == "install"


def test_a_mounted_disk_is_not_overwritten(base, guest, loop, upstream):
    """The image goes nowhere while the target is mounted: O_EXCL refuses it, failed is posted, the disk is intact."""
    run("mke2fs", "-q", "-F", "-t", "ext4", loop)
    upstream.answer("/images/root.img", 200, ext4_image(base), content_type="application/octet-stream")
    zipapp = build_documented_zipapp(base / "checkout")
    held = base / "held"
    held.mkdir()
    run("mount", "-o", "ro", loop, str(held))
    try:
        with installing(base, guest, {"os-image": f"{upstream.base}/images/root.img"}, None) as (server, instance_id):
            done = guest_install(guest, zipapp, server, loop)
            posted = events(server, instance_id)
        assert not (held / "marker").exists()
    finally:
        run("umount", str(held), check=False)
    assert done.returncode == 1, done.stderr
    assert [e["state"] for e in posted] == ["started", "failed"]
    assert f"cannot open {loop} for writing: Device or resource busy" in posted[-1]["message"]


def test_the_package_survives_a_create_that_formats_the_disk(base, guest, loop, upstream):
    """A create that makes a new filesystem over the image's: the package is unpacked onto it afterwards, and stays."""
    upstream.answer("/images/root.img", 200, ext4_image(base), content_type="application/octet-stream")
    upstream.answer("/pkg/site.tar.gz", 200, package(), content_type="application/gzip")
    parameters = {"os-image": f"{upstream.base}/images/root.img", "os-package": f"{upstream.base}/pkg/site.tar.gz",
                  "greeting": GREETING, "format": "yes"}
    zipapp = build_documented_zipapp(base / "checkout")
    with installing(base, guest, parameters, parameters["os-package"]) as (server, instance_id):
        done = guest_install(guest, zipapp, server, loop)
        posted = events(server, instance_id)
    assert done.returncode == 0, done.stderr
    assert [e["state"] for e in posted if e["state"] != "mode"] == ["started", "image", "script", "package",
                                                                     "succeeded"]
    assert read_disk(loop, base / "disk", "etc/imds-package", "created-by-script") == [
        "from the package\n", f"vm1.example.com\n{GREETING}\n"]
    assert run("blkid", "-p", "-o", "value", "-s", "LABEL", loop).stdout.strip() == "formatted"  # create's own
    assert sorted(read_disk(loop, base / "again", ".")[0]) == ["created-by-script", "etc", "lost+found"]


def test_a_root_filesystem_that_cannot_be_mounted_fails_clearly(base, guest, loop, upstream):
    """A create that leaves no filesystem: failed, naming the device and that none was found; exit status 1."""
    upstream.answer("/images/root.img", 200, ext4_image(base), content_type="application/octet-stream")
    upstream.answer("/pkg/site.tar.gz", 200, package(), content_type="application/gzip")
    parameters = {"os-image": f"{upstream.base}/images/root.img", "os-package": f"{upstream.base}/pkg/site.tar.gz",
                  "greeting": GREETING, "wipe": "yes"}
    zipapp = build_documented_zipapp(base / "checkout")
    with installing(base, guest, parameters, parameters["os-package"]) as (server, instance_id):
        done = guest_install(guest, zipapp, server, loop)
        posted = events(server, instance_id)
        mode = record(server, instance_id)["mode"]
    assert done.returncode == 1, done.stderr
    assert [e["state"] for e in posted] == ["started", "image", "script", "failed"]
    assert posted[-1]["message"].startswith(
        f"the root filesystem cannot be mounted for os-package: mount {loop} (no filesystem found on it) on ")
    assert mode == "install"
