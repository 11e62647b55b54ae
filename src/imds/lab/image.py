"""The lab's guest image, built from Debian packages and cached by what went into it.

``build`` runs ``mmdebstrap`` (minbase plus systemd, udev, cloud-init, the cloud kernel, a
DHCP client, ifupdown and net-tools: cloud-init's ifupdown renderer writes static routes as
``route(8)`` lines, which fail silently without it) into a directory, copies out the kernel and initrd (QEMU boots
them directly: no bootloader), and makes a raw ext4 filesystem image of the tree with
``mke2fs -d`` (no loop mount). The recipe below — suite, packages, the files written into
the tree, the image size — is hashed; an image whose hash directory already exists is reused.
Change the recipe and the next build makes a new one.

``Recipe`` picks the Debian suite (``bookworm``, the default, has cloud-init 22.4; ``trixie``
25.1; ``sid`` the newest) and any packages beyond the base list (``systemd-imds`` on sid, say):
both are part of the hash, so each suite and each package set is an image of its own, cached
side by side as ``debian-SUITE-KEY``. Two builds of one recipe at the same time (two engineers,
two CI jobs on one cache) take turns on a lock file: the second reuses what the first built.

What the tree gets besides the packages (each met as a pitfall in the first boots):

- ``/etc/network/interfaces`` sources ``interfaces.d/*``, where cloud-init's fallback network
  config (DHCP on the first NIC, ``ens3`` under QEMU) lands;
- ``/etc/hostname`` is ``lab-image``, so a console line naming the expected host proves
  that cloud-init set it;
- ``/etc/fstab`` mounts ``/dev/vda`` as the root;
- ``/etc/dhcp/dhclient.conf`` is Debian's with ``timeout 20`` (not 60): an IPv6-only guest
  has no DHCPv4 server, and cloud-init's two stages and ifupdown each wait that long for one;
- ``/etc/resolv.conf`` is empty: mmdebstrap copies the build host's in, and a guest with a
  default route then waits 40 s on that unreachable resolver in cloud-init's EC2 crawl
  (``is_resolvable_url``) until DHCP gives it the lab's.

And per suite (``SUITE_FILES``), trixie's OpenStack metadata URLs: cloud-init 25.1 asks
``http://[fe80::a9fe:a9fe%25ens2]`` (the zone by interface name), which trixie's
python3-requests 2.32 hands to ``getaddrinfo`` still percent-encoded (``…%25ens2``: no such
host), so no packet ever leaves; the same address with the interface's index as its zone
(``%252``: the first NIC, ``lo`` being 1) goes through (docs/lab.md, "IPv6-only OpenStack").
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from imds.errors import LabError
from imds.lab.run import sh, spawn, tool_env

RECIPE_VERSION = 1
SUITE = "bookworm"
SUITES = ("bookworm", "trixie", "sid")  # Debian 12, 13 and unstable (cloud-init 22.4, 25.1, 26.x)
PACKAGES = (
    "systemd-sysv", "udev", "cloud-init", "linux-image-cloud-amd64", "iproute2", "isc-dhcp-client",
    "curl", "ifupdown", "netbase", "net-tools",
)
# What a suite no longer has, and what takes its place there: ISC's DHCP client left unstable in 2026
# (ifupdown and cloud-init use dhcpcd instead).
REPLACED = {"sid": {"isc-dhcp-client": "dhcpcd-base"}}
IMAGE_SIZE = 2 << 30  # sparse: about 450 MB of it is used
BUILD_TIMEOUT = 1800.0
FILES = {
    "etc/network/interfaces": "auto lo\niface lo inet loopback\n\nsource /etc/network/interfaces.d/*\n",
    "etc/hostname": "lab-image\n",
    "etc/fstab": "/dev/vda / ext4 rw,errors=remount-ro 0 1\n",
    "etc/resolv.conf": "",  # not the build host's resolver (mmdebstrap copies it in)
    # Debian's dhclient.conf with a 20 s timeout instead of 60: an IPv6-only guest has no DHCPv4 server,
    # and cloud-init (local and network stage) and ifupdown each wait the whole timeout for one.
    "etc/dhcp/dhclient.conf": (
        "option rfc3442-classless-static-routes code 121 = array of unsigned integer 8;\n"
        "send host-name = gethostname();\n"
        "request subnet-mask, broadcast-address, time-offset, routers, domain-name, domain-name-servers,\n"
        "  domain-search, host-name, dhcp6.name-servers, dhcp6.domain-search, dhcp6.fqdn, dhcp6.sntp-servers,\n"
        "  netbios-name-servers, netbios-scope, interface-mtu, rfc3442-classless-static-routes, ntp-servers;\n"
        "timeout 20;\n"
    ),
    "etc/cloud/cloud.cfg.d/90-imds-lab.cfg": (
        "# imds lab: the serial console is the witness; ds-identify takes ci.ds= from the kernel command line\n"
        "datasource:\n  Ec2:\n    strict_id: false\n"
    ),
}
# What an operator's image for an IPv6-only OpenStack cloud carries, by suite (bookworm's cloud-init has
# no IPv6 metadata address for OpenStack; sid's urllib3 refuses any zone in a URL, docs/lab.md).
OPENSTACK_V6_ZONE_INDEX = 2  # the first NIC's interface index (lo is 1): its link-local zone
SUITE_FILES = {
    "trixie": {
        "etc/cloud/cloud.cfg.d/91-imds-lab-openstack-ipv6.cfg": (
            "# OpenStack's IPv6 metadata address with the zone as an interface index, not a name: cloud-init 25.1's\n"
            "# own default, http://[fe80::a9fe:a9fe%25ens2], reaches getaddrinfo still percent-encoded through\n"
            "# python3-requests 2.32 and never connects (canonical/cloud-init#6205, psf/requests#6735).\n"
            "datasource:\n  OpenStack:\n    metadata_urls:\n"
            f"      - http://[fe80::a9fe:a9fe%25{OPENSTACK_V6_ZONE_INDEX}]\n"
            "      - http://169.254.169.254\n"
        ),
    },
}


@dataclass(frozen=True)
class Image:
    """A bootable guest: a disk image, and the kernel and initrd to give QEMU (None: the disk boots itself)."""

    disk: Path
    kernel: Path | None = None
    initrd: Path | None = None
    key: str = ""
    suite: str | None = None  # the Debian suite it was built from (None: an operator's --image)
    cloud_init: str | None = None  # the cloud-init package version in it, when known

    @property
    def format(self) -> str:
        """QEMU's name for the disk's format (raw for built images, else what the file says)."""
        if self.kernel is not None:
            return "raw"
        info = json.loads(sh("qemu-img", "info", "--output=json", str(self.disk)))
        return str(info["format"])


@dataclass(frozen=True)
class Recipe:
    """What to build: the Debian suite and the packages beyond the base list (both part of the cache key)."""

    suite: str = SUITE
    extra: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        """LabError for a suite mmdebstrap is not known to build here, or a package name apt would refuse."""
        if self.suite not in SUITES:
            msg = f"unknown suite {self.suite!r}: one of {', '.join(SUITES)}"
            raise LabError(msg)
        for name in self.extra:
            if not _PACKAGE.fullmatch(name):
                msg = f"--package {name!r} is not a Debian package name"
                raise LabError(msg)

    @property
    def packages(self) -> list[str]:
        """The base packages, then the extra ones (sorted, each once, none repeated from the base)."""
        return [*PACKAGES, *sorted(set(self.extra) - set(PACKAGES))]

    @property
    def installed(self) -> list[str]:
        """``packages`` as this suite has them (``REPLACED``): what mmdebstrap is asked to install."""
        replaced = REPLACED.get(self.suite, {})
        return list(dict.fromkeys(replaced.get(name, name) for name in self.packages))

    @property
    def files(self) -> dict[str, str]:
        """The files written into the tree: every suite's, then this suite's own."""
        return {**FILES, **SUITE_FILES.get(self.suite, {})}

    def describe(self) -> dict[str, object]:
        """Everything the image is made from (its hash names the cached image)."""
        described: dict[str, object] = {"version": RECIPE_VERSION, "suite": self.suite, "variant": "minbase",
                                        "packages": self.packages, "files": self.files, "size": IMAGE_SIZE}
        if self.installed != self.packages:  # only where a suite replaces a package: the other keys stay as they were
            described["installed"] = self.installed
        return described

    @property
    def key(self) -> str:
        """16 hex digits of the recipe's SHA-256."""
        return hashlib.sha256(json.dumps(self.describe(), sort_keys=True).encode()).hexdigest()[:16]

    def directory(self, out: Path) -> Path:
        """Where this recipe's image is cached under ``out``."""
        return out / f"debian-{self.suite}-{self.key}"


_PACKAGE = re.compile(r"[a-z0-9][a-z0-9+.-]+")  # Debian policy 5.6.1


def recipe(chosen: Recipe | None = None) -> dict[str, object]:
    """Everything ``chosen`` (default: bookworm, base packages) is made from."""
    return (chosen or Recipe()).describe()


def recipe_key(chosen: Recipe | None = None) -> str:
    """16 hex digits of the recipe's SHA-256."""
    return (chosen or Recipe()).key


def cached(out: Path, chosen: Recipe | None = None) -> Image | None:
    """The image for the recipe under ``out``, if it was built."""
    chosen = chosen or Recipe()
    target = chosen.directory(out)
    if not (target / "manifest.json").is_file():
        return None
    manifest = json.loads((target / "manifest.json").read_text())
    return Image(target / "rootfs.ext4", target / "vmlinuz", target / "initrd.img", chosen.key, chosen.suite,
                 manifest.get("cloud_init"))


def _hooks(files: dict[str, str]) -> list[str]:
    hooks = []
    for path, text in files.items():
        parent = str(Path(path).parent)
        hooks.append(f'--customize-hook=mkdir -p "$1/{parent}" && printf %s {_quote(text)} > "$1/{path}"')
    return hooks


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def build(out: Path, mirror: str | None = None, say: Callable[[str], None] | None = None,
          chosen: Recipe | None = None) -> Image:
    """The image for ``chosen`` under ``out``: reused when present, else built (progress to ``say``)."""
    tell = say or (lambda line: print(line, file=sys.stderr))  # noqa: T201 - the default sink is the terminal
    chosen = chosen or Recipe()
    out.mkdir(parents=True, exist_ok=True)
    with (out / f".build-{chosen.key}.lock").open("a") as lock:
        if cached(out, chosen) is None and _held(lock):
            tell(f"image: another build of recipe {chosen.key} is running; waiting for it")
            fcntl.flock(lock, fcntl.LOCK_EX)
        found = cached(out, chosen)
        if found is not None:
            tell(f"image: reusing {found.disk.parent} (recipe {found.key})")
            return found
        return _build(out, mirror, tell, chosen)


def _held(lock: IO[str]) -> bool:
    """Take the lock without waiting; whether someone else holds it."""
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    return False


def _build(out: Path, mirror: str | None, tell: Callable[[str], None], chosen: Recipe) -> Image:
    for tool in ("mmdebstrap", "mke2fs"):
        if shutil.which(tool, path=tool_env()["PATH"]) is None:
            msg = f"{tool} is missing: apt-get install mmdebstrap e2fsprogs (scripts/test does)"
            raise LabError(msg)
    key = chosen.key
    target = chosen.directory(out)
    work = out / f".build-{key}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    started = time.monotonic()
    try:
        tree = work / "rootfs"
        _debootstrap(tree, work / "mmdebstrap.log", (chosen, mirror), tell, started)
        kernel, initrd = _boot_files(tree, work)
        version = installed_version(tree, "cloud-init")
        tell(f"image: [{time.monotonic() - started:5.0f}s] mke2fs -d (ext4, {IMAGE_SIZE >> 20} MiB sparse)")
        disk = work / "rootfs.ext4"
        with disk.open("wb") as sparse:
            sparse.truncate(IMAGE_SIZE)
        sh("mke2fs", "-q", "-F", "-t", "ext4", "-L", "imds-lab", "-d", str(tree), str(disk), timeout=600.0)
        shutil.rmtree(tree)
        manifest = {"recipe": chosen.describe(), "key": key, "kernel": kernel, "initrd": initrd,
                    "cloud_init": version, "seconds": round(time.monotonic() - started, 1)}
        (work / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
        shutil.rmtree(target, ignore_errors=True)
        work.rename(target)
    except BaseException:
        _remove_build(work)
        raise
    tell(f"image: [{time.monotonic() - started:5.0f}s] built {target} (cloud-init {version})")
    return Image(target / "rootfs.ext4", target / "vmlinuz", target / "initrd.img", key, chosen.suite, version)


def installed_version(tree: Path, package: str) -> str | None:
    """The version of ``package`` dpkg installed in ``tree`` (its status file), None when absent."""
    status = tree / "var" / "lib" / "dpkg" / "status"
    if not status.is_file():
        return None
    for stanza in status.read_text(errors="replace").split("\n\n"):
        fields = dict(line.split(": ", 1) for line in stanza.splitlines() if ": " in line and line[0] != " ")
        if fields.get("Package") == package and fields.get("Status", "").endswith(" installed"):
            return fields.get("Version")
    return None


def _remove_build(work: Path) -> None:
    """Remove a failed build's directory, unmounting first what mmdebstrap left mounted inside it."""
    prefix = str(work.resolve()) + "/"
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()
              if line.split()[1].startswith(prefix)]
    for mount in sorted(mounts, key=len, reverse=True):  # the deepest first
        sh("umount", "--lazy", mount, check=False)
    if any(line.split()[1].startswith(prefix) for line in Path("/proc/self/mounts").read_text().splitlines()):
        msg = f"left {work}: something is still mounted inside it (umount it, then remove the directory)"
        raise LabError(msg)
    shutil.rmtree(work, ignore_errors=True)


def _stop_group(process: subprocess.Popen[bytes]) -> None:
    """Stop mmdebstrap and everything it started (its own process group, by its PID), bounded."""
    if process.poll() is not None:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        try:
            process.wait(timeout=30.0)
        except subprocess.TimeoutExpired:
            continue
        return


def apt_options(suite: str) -> list[str]:
    """The ``--aptopt`` arguments of mmdebstrap for ``suite``.

    Unstable's Release carries a Valid-Until a week ahead, so a mirror kept as a snapshot (this
    machine's) is "expired" within days and apt refuses it; the stable suites carry none. Not
    part of the recipe: it changes what apt accepts, not what the image holds.
    """
    return ['--aptopt=Acquire::Check-Valid-Until "false"'] if suite == "sid" else []


def _debootstrap(tree: Path, log: Path, source: tuple[Recipe, str | None], tell: Callable[[str], None],
                 started: float) -> None:
    chosen, mirror = source
    packages = chosen.installed
    args = ["mmdebstrap", "--variant=minbase", *apt_options(chosen.suite), f"--include={','.join(packages)}",
            *_hooks(chosen.files), chosen.suite, str(tree)]
    if mirror:
        args.append(mirror)
    tell(f"image: mmdebstrap {chosen.suite} ({len(packages)} packages and their dependencies), log {log}")
    process = spawn(args, log)
    seen = 0
    deadline = started + BUILD_TIMEOUT
    try:
        while process.poll() is None and time.monotonic() < deadline:
            seen = _progress(log, seen, tell, started)
            time.sleep(0.5)
        timed_out = process.poll() is None
    finally:
        _stop_group(process)  # at once when it has exited; on Ctrl-C or at the deadline: it and its apt/dpkg
    if timed_out:
        raise LabError(f"mmdebstrap took over {BUILD_TIMEOUT:.0f}s; see {log}")
    _progress(log, seen, tell, started)
    if process.returncode != 0:
        tail = log.read_text(errors="replace")[-2000:]
        raise LabError(f"mmdebstrap exited {process.returncode}:\n{tail}")


def _progress(log: Path, seen: int, tell: Callable[[str], None], started: float) -> int:
    """Print mmdebstrap's new ``I:`` lines (its phases); the number of lines read so far."""
    lines = log.read_text(errors="replace").splitlines()
    for line in lines[seen:]:
        if line.startswith(("I: ", "E: ", "W: ")):
            tell(f"image: [{time.monotonic() - started:5.0f}s] {line}")
    return len(lines)


def _boot_files(tree: Path, work: Path) -> tuple[str, str]:
    """Copy the newest kernel and its initrd out of ``tree``; their file names."""
    kernels = sorted((tree / "boot").glob("vmlinuz-*"))
    if not kernels:
        raise LabError("the tree has no /boot/vmlinuz-*: was linux-image-cloud-amd64 installed?")
    kernel = kernels[-1]
    initrd = tree / "boot" / ("initrd.img-" + kernel.name.removeprefix("vmlinuz-"))
    if not initrd.is_file():
        raise LabError(f"no {initrd.name} beside {kernel.name}: initramfs-tools did not run")
    shutil.copyfile(kernel, work / "vmlinuz")
    shutil.copyfile(initrd, work / "initrd.img")
    return kernel.name, initrd.name
