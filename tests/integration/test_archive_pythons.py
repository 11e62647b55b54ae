"""Hostile packages under both pythons an install runs on: the venv's and Debian 12's ``/usr/bin/python3`` (3.11.2).

Each case is a tar.gz (and sometimes something already on the target root) unpacked by the
guest tool's ``safe_extract`` from the zipapp docs/guest.md builds, run isolated
(``-I -S``: the standard library only) under each python; the service's check
(``imds.services.ganeti.package.archive_problem``) judges the same archive. Afterwards
nothing outside the root changed, the root kept its mode and owner, and a refused archive
left the root exactly as it was. 3.11.2 has no tarfile ``data`` filter: whatever
protection there is must be imds's own.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import stat
import subprocess
import sys
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from guest_zipapp import build_documented_zipapp
from imds.services.ganeti.package import archive_problem

SYSTEM_PYTHON = "/usr/bin/python3"
PYTHONS = {"venv": sys.executable, "debian": SYSTEM_PYTHON}
STEPS = "abcdefghijklmnop"
DRIVER = """
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from imds.guest.errors import InstallError
from imds.guest.ganeti_files import safe_extract
try:
    print(json.dumps({"count": safe_extract(Path(sys.argv[2]), Path(sys.argv[3]))}))
except InstallError as exc:
    print(json.dumps({"refused": str(exc)}))
"""


@dataclass(frozen=True)
class Place:
    """One run's directories: the root to unpack under, and ``outside`` (holding ``flag``) next to it."""

    root: Path
    outside: Path


class Tar:
    """A tar being written, member by member."""

    def __init__(self) -> None:
        self.raw = io.BytesIO()
        self.tar = tarfile.open(fileobj=self.raw, mode="w", format=tarfile.PAX_FORMAT)  # noqa: SIM115 - closed in gz

    def add(self, name: str, kind: bytes = tarfile.REGTYPE, *, link: str = "", data: bytes | None = None,
            mode: int = 0o644, uid: int = 0) -> None:
        info = tarfile.TarInfo(name)
        info.type, info.linkname, info.mode, info.uid, info.gid = kind, link, mode, uid, uid
        if kind == tarfile.CHRTYPE:
            info.devmajor, info.devminor = 1, 3
        if data is not None:
            info.size = len(data)
        self.tar.addfile(info, io.BytesIO(data) if data is not None else None)

    def gz(self) -> bytes:
        self.tar.close()
        return gzip.compress(self.raw.getvalue(), mtime=0)


def path_max_chain(tar: Tar, root: Path) -> str:
    """CVE-2025-4517's construction: 16 links to long directories, then a link whose path is over PATH_MAX.

    ``os.path.realpath`` (strict=False) stops resolving at that link and keeps the rest of
    the path as written, while the kernel follows it: back to the root, and from there
    ``..`` goes on. Returns the link's path.
    """
    component = "d" * ((os.pathconf(root, "PC_PATH_MAX") - len(str(root)) - 1) // (len(STEPS) + 1))
    path = ""
    for step in STEPS:
        tar.add(f"{path}{component}", tarfile.DIRTYPE, mode=0o755)
        tar.add(f"{path}{step}", tarfile.SYMTYPE, link=component)
        path = f"{path}{component}/"
    link = "/".join([*STEPS, "l" * 254])
    tar.add(link, tarfile.SYMTYPE, link="/".join([".."] * len(STEPS)))
    return link


def path_max_new_file(place: Place) -> bytes:
    tar = Tar()
    tar.add("escape", tarfile.SYMTYPE, link=f"{path_max_chain(tar, place.root)}/../{place.outside.name}")
    tar.add("escape/newfile", data=b"written outside")
    return tar.gz()


def path_max_hard_link(place: Place) -> bytes:
    tar = Tar()
    tar.add("escape", tarfile.SYMTYPE, link=f"{path_max_chain(tar, place.root)}/../{place.outside.name}")
    tar.add("flaglink", tarfile.LNKTYPE, link="escape/flag")
    tar.add("flaglink", data=b"overwritten through a hard link")
    return tar.gz()


def dot_member(_place: Place) -> bytes:
    tar = Tar()
    tar.add(".", tarfile.DIRTYPE, mode=0o777, uid=4242)
    tar.add("etc/motd", data=b"hello")
    return tar.gz()


def set_id_bits(_place: Place) -> bytes:
    tar = Tar()
    tar.add("usr/bin/tool", data=b"#!/bin/sh\n", mode=0o6755)
    tar.add("srv/shared", tarfile.DIRTYPE, mode=0o3775)
    return tar.gz()


def chain_bent_outside(place: Place) -> bytes:
    """``l -> d/../outside/flag`` is inside while ``d`` is absent; ``d -> .`` then makes it climb out."""
    tar = Tar()
    tar.add("l", tarfile.SYMTYPE, link=f"d/../{place.outside.name}/flag")
    tar.add("d", tarfile.SYMTYPE, link=".")
    return tar.gz()


def absolute_name(place: Place) -> bytes:
    tar = Tar()
    tar.add(str(place.outside / "absolute"), data=b"written outside")
    return tar.gz()


def dot_dot(place: Place) -> bytes:
    tar = Tar()
    tar.add(f"a/../../{place.outside.name}/climbed", data=b"written outside")
    return tar.gz()


def char_device(_place: Place) -> bytes:
    tar = Tar()
    tar.add("dev/null0", tarfile.CHRTYPE, mode=0o666)
    return tar.gz()


def fifo(_place: Place) -> bytes:
    tar = Tar()
    tar.add("run/pipe", tarfile.FIFOTYPE)
    return tar.gz()


def absolute_link_on_target(place: Place) -> bytes:
    """The target already has ``var/run -> <outside>`` (as Debian's ``/var/run -> /run``)."""
    (place.root / "var").mkdir()
    (place.root / "var" / "run").symlink_to(place.outside)
    tar = Tar()
    tar.add("var/run/pid", data=b"1")
    return tar.gz()


def all_or_nothing(place: Place) -> bytes:
    """A member replaces ``etc/hostname``, a later one is refused on the target: the old hostname is back."""
    (place.root / "etc").mkdir()
    (place.root / "etc" / "hostname").write_text("old\n")
    (place.root / "var").mkdir()
    (place.root / "var" / "run").symlink_to(place.outside)
    tar = Tar()
    tar.add("etc/hostname", data=b"new\n")
    tar.add("etc/new-file", data=b"new\n")
    tar.add("var/run/pid", data=b"1")
    return tar.gz()


@dataclass(frozen=True)
class Case:
    build: Callable[[Place], bytes]
    guest_refuses: bool
    service_refuses: bool
    check: Callable[[Place], None] | None = None


def accepted_dot(place: Place) -> None:
    assert (place.root / "etc" / "motd").read_bytes() == b"hello"


def accepted_set_id(place: Place) -> None:
    assert stat.S_IMODE((place.root / "usr" / "bin" / "tool").stat().st_mode) == 0o755
    assert stat.S_IMODE((place.root / "srv" / "shared").stat().st_mode) == 0o1775


CASES = {
    "path-max-new-file": Case(path_max_new_file, guest_refuses=True, service_refuses=True),
    "path-max-hard-link": Case(path_max_hard_link, guest_refuses=True, service_refuses=True),
    "dot-member": Case(dot_member, guest_refuses=False, service_refuses=False, check=accepted_dot),
    "set-id-bits": Case(set_id_bits, guest_refuses=False, service_refuses=False, check=accepted_set_id),
    "link-chain": Case(chain_bent_outside, guest_refuses=True, service_refuses=True),
    "absolute-name": Case(absolute_name, guest_refuses=True, service_refuses=True),
    "dot-dot": Case(dot_dot, guest_refuses=True, service_refuses=True),
    "char-device": Case(char_device, guest_refuses=True, service_refuses=True),
    "fifo": Case(fifo, guest_refuses=True, service_refuses=True),
    "absolute-link-on-target": Case(absolute_link_on_target, guest_refuses=True, service_refuses=False),
    "all-or-nothing": Case(all_or_nothing, guest_refuses=True, service_refuses=False),
}


def snapshot(root: Path) -> dict[str, tuple[int, str]]:
    """Every entry under ``root`` (links not followed): its type bits and a link's target or a file's bytes."""
    found: dict[str, tuple[int, str]] = {}
    for directory, names, files in os.walk(root):
        for name in [*names, *files]:
            path = Path(directory) / name
            mode = path.lstat().st_mode
            content = str(path.readlink()) if path.is_symlink() else path.read_text() if path.is_file() else ""
            found[str(path.relative_to(root))] = (stat.S_IFMT(mode), content)
    return found


@pytest.fixture(scope="module")
def zipapp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_documented_zipapp(tmp_path_factory.mktemp("zipapp") / "checkout")


@pytest.fixture
def place(tmp_path: Path) -> Place:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir(mode=0o700)
    root.chmod(0o700)
    outside.mkdir()
    (outside / "flag").write_text("original")
    return Place(root, outside)


def test_the_system_python_has_no_data_filter():
    """What the appliance runs: Debian 12's python 3.11.2, whose tarfile has no extraction filters."""
    code = "import sys, tarfile; print(sys.version_info[:3], hasattr(tarfile, 'data_filter'))"
    done = subprocess.run([SYSTEM_PYTHON, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=30,
                          check=True)
    assert done.stdout.strip() == "(3, 11, 2) False"


@pytest.mark.parametrize("python", PYTHONS)
@pytest.mark.parametrize("name", CASES)
def test_the_guest_tool_keeps_everything_inside_the_root(zipapp: Path, place: Place, python: str, name: str):
    """Refused (nothing left behind) or unpacked safely; outside the root nothing changed; the root kept mode/owner."""
    case = CASES[name]
    archive = place.root.parent / "package.tar.gz"
    archive.write_bytes(case.build(place))
    before, root_stat = snapshot(place.root), place.root.stat()
    done = subprocess.run([PYTHONS[python], "-I", "-S", "-c", DRIVER, str(zipapp), str(archive), str(place.root)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    outcome = json.loads(done.stdout)
    assert [path.name for path in place.outside.iterdir()] == ["flag"]
    assert (place.outside / "flag").read_text() == "original"
    after = place.root.stat()
    assert (stat.S_IMODE(after.st_mode), after.st_uid, after.st_gid) == (0o700, root_stat.st_uid, root_stat.st_gid)
    if case.guest_refuses:
        assert "refused" in outcome, outcome
        assert snapshot(place.root) == before
    else:
        assert "count" in outcome, outcome
        assert case.check is not None
        case.check(place)


@pytest.mark.parametrize("name", CASES)
def test_the_service_check_judges_the_same_archives(place: Place, name: str):
    """The service refuses to serve every archive that is hostile in itself; a target's own links it cannot see."""
    case = CASES[name]
    problem = archive_problem(case.build(place))
    assert (problem is not None) == case.service_refuses, problem
