"""imds.tarball's rules (``check``) and the guest's unpacking onto a directory (``imds.guest.unpack``), in process.

tests/integration/test_archive_pythons.py runs the hostile cases under both pythons through
the guest zipapp; these pin the rules one by one, the target-dependent ones included
(links already on the target, writes never going through a link, all or nothing).
"""

from __future__ import annotations

import errno
import gzip
import io
import os
import stat
import tarfile
from pathlib import Path

import pytest

from imds import tarball
from imds.guest import unpack
from imds.guest.unpack import Disk


def tar_gz(*members: tuple[str, str, str]) -> bytes:
    """(kind, name, data-or-linkname); kind is file, dir, sym, hard, fifo or chr."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for kind, name, extra in members:
            info = tarfile.TarInfo(name)
            info.mode = 0o755 if kind == "dir" else 0o644
            if kind == "file":
                info.size = len(extra.encode())
                tar.addfile(info, io.BytesIO(extra.encode()))
                continue
            info.type = {"dir": tarfile.DIRTYPE, "sym": tarfile.SYMTYPE, "hard": tarfile.LNKTYPE,
                         "fifo": tarfile.FIFOTYPE, "chr": tarfile.CHRTYPE}[kind]
            info.linkname = extra
            tar.addfile(info)
    return gzip.compress(raw.getvalue(), mtime=0)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "root"
    path.mkdir()
    return path


def unpacked(root: Path, data: bytes) -> int:
    archive = root.parent / "package.tar.gz"
    archive.write_bytes(data)
    return unpack.unpack(archive, root)


def refused(root: Path, data: bytes) -> str:
    with pytest.raises(tarball.ArchiveError) as raised:
        unpacked(root, data)
    return str(raised.value)


@pytest.mark.parametrize(("members", "why"), [
    ((("file", "../x", "x"),), "member '../x' has a '..' component"),
    ((("file", "/etc/x", "x"),), "member '/etc/x' has an absolute path"),
    ((("file", "a" * 256, "x"),), "is not a valid file name"),
    ((("sym", "s", "/etc/shadow"),), "symbolic link 's' points outside the archive ('/etc/shadow')"),
    ((("sym", "s", ""),), "symbolic link 's' points outside the archive ('')"),
    ((("sym", "a/s", "../../x"),), "symbolic link 'a/s' points outside the archive ('../../x'): '..' climbs above"),
    ((("hard", "h", "etc/passwd"),), "hard link 'h' points outside the archive ('etc/passwd'): not a regular"),
    ((("file", "f", "x"), ("sym", "s", "f"), ("hard", "h", "s")), "not a regular file unpacked before it"),
    ((("file", "f", "x"), ("sym", "f", "."), ("hard", "h", "f")), "not a regular file any more"),
    ((("fifo", "p", ""),), "member 'p' is a device, FIFO or other special file"),
    ((("chr", "c", ""),), "member 'c' is a device, FIFO or other special file"),
    ((("sym", ".", "x"),), "member '.' names the root"),
    ((("sym", "a", "b"), ("sym", "b", "a")), "outside the archive once unpacked ('b'): a symbolic link loop"),
    ((("sym", "l", "d/../x"), ("sym", "d", ".")), "symbolic link 'l' points outside the archive once unpacked"),
    ((("file", "f", "x"), ("file", "f/g", "y")), "member 'f/g' would be written outside the target: 'f' is not a"),
    ((("dir", "d", ""), ("file", "d", "x")), "member 'd': a directory is in the way"),
    ((("file", "d", ""), ("dir", "d", "")), "directory 'd': a file is in the way"),
])
def test_check_refuses_with_the_member_and_the_reason(members, why):
    """Every rule that needs no target: ``check`` says which member and why."""
    problem = tarball.check(tar_gz(*members))
    assert problem is not None
    assert why in problem


def test_check_accepts_links_that_stay_inside():
    """Relative links within the tree, a chain through a link to a directory, a hard link to an earlier file."""
    good = tar_gz(("dir", "./usr/lib", ""), ("sym", "lib", "usr/lib"), ("file", "lib/x.so", "x"),
                  ("sym", "usr/lib/up", "../../lib/x.so"), ("hard", "again", "lib/x.so"), ("dir", "lib", ""),
                  ("sym", "dangling", "not/yet/there"))
    assert tarball.check(good) is None


WHOLE = tar_gz(("file", "a", os.urandom(50000).hex()))


@pytest.mark.parametrize("data", [b"plain bytes", gzip.compress(b"\0" * 10), WHOLE[: len(WHOLE) // 2],
                                  WHOLE[:-8], WHOLE[:-1]], ids=["plain", "not-tar", "half", "no-trailer", "cut-1"])
def test_not_an_archive_or_a_cut_one(data):
    """A cut in the last bytes (tarfile stops there quietly) is refused as well as a cut in the headers."""
    assert tarball.check(WHOLE) is None
    problem = tarball.check(data)
    assert problem is not None
    assert problem.startswith("not a gzip-compressed tar archive (or a truncated one)")


def test_member_count_is_capped(monkeypatch):
    """More members than MAX_MEMBERS: refused (the imagined tree never grows without bound)."""
    monkeypatch.setattr(tarball, "MAX_MEMBERS", 3)
    assert tarball.check(tar_gz(*(("file", f"f{n}", "") for n in range(3)))) is None
    assert tarball.check(tar_gz(*(("file", f"f{n}", "") for n in range(4)))) == "more than 3 members"


def test_links_already_on_the_target_are_followed_only_beneath_it(root, tmp_path):
    """``lib -> usr/lib`` (merged /usr) is followed; ``var/run -> /outside`` (absolute) refuses the member."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "usr" / "lib").mkdir(parents=True)
    (root / "lib").symlink_to("usr/lib")
    (root / "var").mkdir()
    (root / "var" / "run").symlink_to(outside)
    assert unpacked(root, tar_gz(("dir", "lib", ""), ("file", "lib/x.so", "x"))) == 2
    assert (root / "usr" / "lib" / "x.so").read_text() == "x"
    assert (root / "lib").is_symlink()
    why = refused(root, tar_gz(("file", "var/run/pid", "1")))
    assert why == "member 'var/run/pid' would be written outside the target: through the absolute link 'var/run'"
    assert list(outside.iterdir()) == []


def test_a_write_never_goes_through_a_link_already_there(root, tmp_path):
    """A file hard-linked (or symlinked) out of the root is replaced, never written through."""
    outside = tmp_path / "outside"
    outside.write_text("precious")
    (root / "hard").hardlink_to(outside)
    (root / "soft").symlink_to(outside)
    unpacked(root, tar_gz(("file", "hard", "new"), ("file", "soft", "new")))
    assert outside.read_text() == "precious"
    assert (root / "hard").read_text() == (root / "soft").read_text() == "new"
    assert not (root / "soft").is_symlink()
    assert (root / "hard").stat().st_ino != outside.stat().st_ino


def test_hard_links_and_modes(root):
    """A hard link shares its target's inode; set-id bits go, a directory keeps its sticky bit; the root its mode."""
    root.chmod(0o750)
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, kind, mode in ((".", tarfile.DIRTYPE, 0o777), ("tmp", tarfile.DIRTYPE, 0o3777),
                                 ("bin/su", tarfile.REGTYPE, 0o4755), ("bin/again", tarfile.LNKTYPE, 0o4755)):
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.linkname = kind, mode, "bin/su" if kind == tarfile.LNKTYPE else ""
            tar.addfile(info, io.BytesIO(b"") if kind == tarfile.REGTYPE else None)
    assert unpacked(root, gzip.compress(raw.getvalue())) == 4
    assert stat.S_IMODE(root.stat().st_mode) == 0o750
    assert stat.S_IMODE((root / "tmp").stat().st_mode) == 0o1777
    assert stat.S_IMODE((root / "bin" / "su").stat().st_mode) == 0o755
    assert (root / "bin" / "again").stat().st_ino == (root / "bin" / "su").stat().st_ino
    assert not any(path.name.startswith(".imds-unpack") for path in (root / "bin").iterdir())


def snapshot(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): (str(p.readlink()) if p.is_symlink() else p.read_text() if p.is_file() else "/")
            for p in sorted(root.rglob("*"))}


def test_a_refusal_on_the_target_undoes_everything(root, tmp_path):
    """Made files and directories go, replaced ones come back, no temporary name is left."""
    (root / "etc").mkdir()
    (root / "etc" / "hostname").write_text("old")
    (root / "etc" / "motd").symlink_to("hostname")
    (root / "run").symlink_to(tmp_path)
    before = snapshot(root)
    why = refused(root, tar_gz(("file", "etc/hostname", "new"), ("sym", "etc/motd", "issue"),
                               ("file", "etc/hostname", "newer"), ("file", "new/deep/file", "x"),
                               ("file", "run/pid", "1")))
    assert "member 'run/pid' would be written outside the target" in why
    assert snapshot(root) == before


def test_an_io_error_midway_undoes_everything(root, monkeypatch):
    """The second file fails to write (ENOSPC): the first is gone again, the error says why."""
    (root / "keep").write_text("old")
    writes = []
    real = Disk._write  # the disk's own writer, failed on purpose

    def failing(directory, name, member, source):
        writes.append(member.name)
        if len(writes) == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(directory, name, member, source)

    monkeypatch.setattr(Disk, "_write", staticmethod(failing))
    why = refused(root, tar_gz(("file", "keep", "new"), ("file", "more", "x")))
    assert why == f"unpacking under {root}: No space left on device"
    assert snapshot(root) == {"keep": "old"}


def test_a_dot_member_and_prefixes(root):
    """``./``, ``.`` and doubled slashes name the same places; the count is every member."""
    assert unpacked(root, tar_gz(("dir", "./", ""), ("dir", ".//etc/", ""), ("file", "./etc//motd", "hi"))) == 3
    assert snapshot(root) == {"etc": "/", "etc/motd": "hi"}
