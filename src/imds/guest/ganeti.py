"""``ganeti install``: a Ganeti OS installation run inside an install appliance or the instance.

Reads ``os/parameters.json`` and ``os/environment``, posts ``started``, then, in Ganeti's
order ("the package is overlaid on the instance filesystem after the scripts that created
it"), as the parameters say: writes ``os/image`` onto the first disk (``os-image``), runs
the OS definition's ``create`` from ``os/os-install-package`` with the served environment
and ``DISK_<n>_PATH`` naming the ``--disk`` devices, then mounts the root filesystem
``create`` left and unpacks ``os/package`` over it (``os-package``); and posts
``succeeded`` (which ends the install mode on the service) or ``failed``. Exit status: see
``OK``…``UNREPORTED``.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from imds.guest.errors import GuestError, InstallError, NotServed, ServiceError
from imds.guest.ganeti_files import CHUNK, copy_image, parse_environment, reread_partitions, safe_extract
from imds.guest.ganeti_http import MAX_DOCUMENT, Service, read_body
from imds.guest.process import failure, output

OK, FAILED, NOT_STARTED, UNREPORTED = 0, 1, 2, 3
DEFAULT_URL = "http://169.254.169.254"
PROGRESS_BYTES = 64 * 1024 * 1024
HOOKS_PATH = "/sbin:/bin:/usr/sbin:/usr/bin"  # the PATH Ganeti gives OS scripts (constants.HOOKS_PATH)
MOUNT_TIMEOUT = 120.0
MOUNT_OPTIONS = "nosuid,nodev,noexec"  # the instance's filesystem is written, never run from, in the appliance
NODE_TIMEOUT = 10.0  # seconds a --root-device node may take to appear after the image
_DISK_PATH = re.compile(r"DISK_(\d+)_PATH")  # fullmatch

Report = Callable[[str], None]


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``ganeti install`` under the guest tool's commands."""
    ganeti = commands.add_parser("ganeti", help="Ganeti OS installation inside the instance")
    actions = ganeti.add_subparsers(dest="action", required=True, metavar="ACTION")
    install = actions.add_parser(
        "install",
        help="install the OS the metadata service describes onto the given disks",
        description=(
            "Read the Ganeti OS parameters and environment from the metadata service, write os-image "
            "onto the first disk, run the OS definition's create script, then unpack os-package over the "
            "root filesystem create left, and report each step through /ganeti/latest/write. Exit status: 0 installed "
            "(succeeded reported), 1 a step failed (failed reported), 2 nothing was done, 3 installed but "
            "succeeded could not be reported."
        ),
    )
    install.add_argument("--disk", action="append", required=True, metavar="DEV",
                         help="the instance's disks in Ganeti's order (DISK_0_PATH, DISK_1_PATH, ...); repeat")
    install.add_argument("--url", default=DEFAULT_URL, help="the metadata service (default: %(default)s)")
    where = install.add_mutually_exclusive_group()
    where.add_argument("--root", type=Path, metavar="DIR",
                       help="the root filesystem, already mounted here, for os-package (default: mount it)")
    where.add_argument("--root-device", metavar="DEV",
                       help="the device holding the root filesystem, mounted for os-package (default: the first "
                       "--disk; e.g. /dev/vda1 after a partitioned image)")
    install.add_argument("--timeout", type=positive_seconds, default=30.0, metavar="SECONDS",
                         help="HTTP timeout per request (default: 30)")
    install.add_argument("--progress-bytes", type=_positive_int, default=PROGRESS_BYTES, metavar="N",
                         help="an image progress event at most every N bytes and every 10%% (default: 64 MiB)")
    install.add_argument("--dry-run", action="store_true", help="read and print the plan; write and post nothing")


def positive_seconds(text: str) -> float:
    """The ``--timeout`` type: a positive number of seconds."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) == 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return int(text)


@dataclass
class Plan:
    """What the service describes: the parameters (name → value) and the script environment."""

    parameters: dict[str, str]
    environment: dict[str, str]
    notes: list[str] = field(default_factory=list)

    @property
    def image(self) -> bool:
        return bool(self.parameters.get("os-image"))

    @property
    def package(self) -> bool:
        return bool(self.parameters.get("os-package"))


def run(options: argparse.Namespace, report: Report) -> int:
    """``ganeti install``: the steps in order; the exit status."""
    service = Service(options.url, timeout=options.timeout)
    try:
        plan = read_plan(service, options.disk)
    except GuestError as exc:
        report(f"error: {exc}; nothing was done")
        return NOT_STARTED
    for note in plan.notes:
        report(note)
    if options.dry_run:
        return _dry_run(service, plan, options, report)
    steps = [name for name, wanted in (("image", plan.image), ("OS create", True), ("package", plan.package)) if wanted]
    try:
        service.event("started", message=f"ganeti install onto {options.disk[0]}: {' + '.join(steps)}")
    except GuestError as exc:
        report(f"error: {exc}; nothing was done")
        return NOT_STARTED
    try:
        with tempfile.TemporaryDirectory(prefix="imds-ganeti-") as work:
            _install(service, plan, options, Path(work), report)
    except GuestError as exc:
        return _failed(service, exc, report)
    try:
        service.event("succeeded", message="ganeti install: done")
    except GuestError as exc:
        report(f"error: installed, but {exc}: the instance stays in its install mode")
        return UNREPORTED
    report("installed; succeeded reported")
    return OK


def read_plan(service: Service, disks: list[str]) -> Plan:
    """Parameters and environment from the service, ``DISK_<n>_PATH`` replaced by ``disks``."""
    document = service.json("os/parameters.json")
    if not isinstance(document, dict) or not all(
        isinstance(value, list) and len(value) == 2 and isinstance(value[0], str)
        for value in document.values()
    ):
        msg = f"{service.url('os/parameters.json')}: not an object of [value, visibility] pairs"
        raise ServiceError(msg)
    parameters = {str(name): str(value[0]) for name, value in document.items()}
    text = service.read("os/environment", 16 * 1024 * 1024).decode("utf-8", errors="replace")
    plan = Plan(parameters, parse_environment(text, service.url("os/environment")))
    # Node paths mean nothing here: each DISK_<n>_PATH is a --disk device, and DISK_COUNT their number.
    for name in [name for name in plan.environment if _DISK_PATH.fullmatch(name)]:
        del plan.environment[name]
    for index, device in enumerate(disks):
        plan.environment[f"DISK_{index}_PATH"] = device
    served = plan.environment.get("DISK_COUNT")
    if served is not None and served != str(len(disks)):
        plan.notes.append(f"note: the instance has {served} disks (DISK_COUNT), {len(disks)} given with --disk: "
                          f"DISK_COUNT={len(disks)}")
    plan.environment["DISK_COUNT"] = str(len(disks))
    return plan


def script_environment(plan: Plan) -> dict[str, str]:
    """What ``create`` runs with: Ganeti's PATH, then the served (and adjusted) environment.

    Nothing else: Ganeti's node daemon runs OS scripts with ``reset_env=True`` (no ``LC_ALL``, nothing inherited).
    """
    return {"PATH": HOOKS_PATH, **plan.environment}


def _install(service: Service, plan: Plan, options: argparse.Namespace, work: Path, report: Report) -> None:
    """Image → create → package: the package is overlaid on what the scripts made, so its files win and stay."""
    first = options.disk[0]
    if plan.image:
        _image(service, first, options.progress_bytes, report)
    else:
        report("image: skipped (no os-image parameter)")
    # Both archives are fetched (and the definition checked) before anything runs: a package that
    # cannot be had fails the install before create changes the disk.
    archive = _download(service, "os/package", work / "package.tar.gz") if plan.package else None
    create = _definition(service, work)
    if create is None:
        report("create: skipped (no OS definition with a create script)")
    else:
        service.event("script", message=f"running {create.parent.name}/create")
        _run_create(create, script_environment(plan), report)
    if archive is None:
        report("package: skipped (no os-package parameter)")
        return
    device = options.root_device or first
    with _root(device, options.root) as root:
        count = safe_extract(archive, root)
    service.event("package", message=f"unpacked {count} entries of os/package over {options.root or device}")
    report(f"package: unpacked {count} entries")


def _image(service: Service, device: str, every: int, report: Report) -> None:
    url = service.url("os/image")
    with service.open("os/image") as response:
        header = response.getheader("Content-Length")
        length = int(header) if header is not None and header.isdigit() else None
        step = max(every, (length or 0) // 10)
        marks = {"next": step}

        def progress(written: int) -> None:
            if written >= marks["next"] and written != length:
                shown = f"{written} of {length} bytes ({written * 100 // length}%)" if length else f"{written} bytes"
                if service.event("image", message=f"{shown} written to {device}", progress=True):
                    report(f"image: {shown}")
                marks["next"] = (written // step + 1) * step

        written = copy_image(response, device, url=url, length=length, progress=progress)
    if (note := reread_partitions(device)) is not None:
        report(f"note: {note}")
    service.event("image", message=f"{written} bytes written to {device}, synced")
    report(f"image: {written} bytes written to {device}")


def _download(service: Service, path: str, target: Path) -> Path:
    """``GET path`` streamed into ``target`` (at most MAX_DOCUMENT bytes)."""
    url = service.url(path)
    with service.open(path) as response, target.open("wb") as sink:
        size = 0
        while chunk := read_body(response, url, CHUNK - 1):
            size += len(chunk)
            if size > MAX_DOCUMENT:
                msg = f"{url}: larger than {MAX_DOCUMENT} bytes"
                raise ServiceError(msg)
            sink.write(chunk)
    return target


@contextlib.contextmanager
def _root(device: str, given: Path | None) -> Iterator[Path]:
    """The first disk's root filesystem: ``--root``, or the device mounted on a temporary directory."""
    if given is not None:
        yield given
        return
    _wait_for_node(device)
    mountpoint = Path(tempfile.mkdtemp(prefix="imds-ganeti-root-"))
    try:
        if (why := failure(["mount", "-o", MOUNT_OPTIONS, device, str(mountpoint)], MOUNT_TIMEOUT)) is not None:
            msg = (f"the root filesystem cannot be mounted for os-package: mount {device} ({_filesystem(device)}) "
                   f"on {mountpoint}: {why} (a partitioned disk: pass --root-device with its root partition)")
            raise InstallError(msg)
        try:
            yield mountpoint
        finally:
            if (why := failure(["umount", str(mountpoint)], MOUNT_TIMEOUT)) is not None:
                raise InstallError(f"unmounting {mountpoint}: {why}")
    finally:
        with contextlib.suppress(OSError):  # still mounted: leave the directory and what is in it
            mountpoint.rmdir()


def _filesystem(device: str) -> str:
    """What is on ``device`` as blkid sees it: ``ext4 filesystem``, ``no filesystem found on it``."""
    found = output(["blkid", "-p", "-o", "value", "-s", "TYPE", device], MOUNT_TIMEOUT)
    if found is None:
        return "no filesystem found on it" if shutil.which("blkid") else "blkid is not available to tell its type"
    return f"{found} filesystem" if found else "no filesystem found on it"


def _wait_for_node(device: str) -> None:
    """A partition's node appears shortly after the partition table is re-read: wait for it (bounded)."""
    deadline = time.monotonic() + NODE_TIMEOUT
    while not Path(device).exists() and time.monotonic() < deadline:
        time.sleep(0.1)


def _definition(service: Service, work: Path) -> Path | None:
    """The unpacked OS definition's ``create`` (at the archive's top or in its one directory), or None."""
    try:
        archive = _download(service, "os/os-install-package", work / "os-install-package.tar.gz")
    except NotServed:
        return None
    unpacked = work / "definition"
    unpacked.mkdir()
    safe_extract(archive, unpacked)
    candidates = [unpacked / "create", *(entry / "create" for entry in sorted(unpacked.iterdir()) if entry.is_dir())]
    return next((path for path in candidates if path.is_file()), None)


def _run_create(create: Path, environment: dict[str, str], report: Report) -> None:
    """Run ``create`` in its directory (as Ganeti does), its output copied to stderr line by line."""
    report(f"create: running {create.parent.name}/create")
    try:
        process = subprocess.Popen(  # noqa: S603 - the OS definition's script, no shell
            [str(create)], cwd=create.parent, env=environment, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )
    except OSError as exc:
        raise InstallError(f"cannot run {create.parent.name}/create: {exc.strerror or exc}") from exc
    assert process.stdout is not None  # noqa: S101 - stdout=PIPE
    with process.stdout:
        for line in process.stdout:
            sys.stderr.write(line.decode("utf-8", errors="replace"))
            sys.stderr.flush()
    code = process.wait()
    if code != 0:
        raise InstallError(f"{create.parent.name}/create exited with status {code}", code=code)
    report("create: exited with status 0")


def _failed(service: Service, error: GuestError, report: Report) -> int:
    code = error.code if isinstance(error, InstallError) else None
    report(f"error: {error}")
    try:
        service.event("failed", code=code, message=str(error))
    except GuestError as exc:
        report(f"error: the failure could not be reported either: {exc}")
    return FAILED


def _dry_run(service: Service, plan: Plan, options: argparse.Namespace, report: Report) -> int:
    first = options.disk[0]
    device = options.root_device or first
    where = f"over {options.root}" if options.root else f"over {device}'s root filesystem (mounted on a temporary dir)"
    image, package = service.url("os/image"), service.url("os/package")
    lines = [f"image: write {image} onto {first}" if plan.image else "image: skipped (no os-image parameter)"]
    with tempfile.TemporaryDirectory(prefix="imds-ganeti-") as work:
        try:
            create = _definition(service, Path(work))
        except GuestError as exc:
            report(f"error: {exc}")
            return NOT_STARTED
        lines.append(f"create: run {create.parent.name}/create" if create else "create: skipped (no create script)")
    lines.append(f"package: unpack {package} {where}" if plan.package else "package: skipped (no os-package parameter)")
    names = sorted(script_environment(plan))
    shown = [f"{n}={plan.environment[n]}" if _DISK_PATH.fullmatch(n) else n for n in names]
    lines.append(f"environment: {' '.join(shown)}")
    sys.stdout.write("".join(f"{line}\n" for line in lines))
    return OK


__all__ = ["add_parser", "read_plan", "run", "script_environment"]
